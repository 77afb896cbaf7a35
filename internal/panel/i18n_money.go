package panel

// Russian for the money pages' words on what is charged and when.
func init() {
	addRU(map[string]string{
		"This hour, not charged yet":                         "Текущий час, ещё не списано",
		"(and %s for the hour now running, not charged yet)": "(и %s за текущий час, ещё не списано)",
	})
}
