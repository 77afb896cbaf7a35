package panel

import (
	"context"
	"time"

	"nimbus/internal/store"
)

// LoadSupport reads the operator's contacts as last saved in db (by the
// panel or "nimbus admin support set"); all empty when none were saved,
// in which case the panel shows those it was started with.
func LoadSupport(ctx context.Context, db *store.DB) (Support, error) {
	return storeOnly(db).SupportSettings(ctx)
}

// SaveSupport replaces the operator's contacts in db, as the panel's
// support settings page does, with the same checks.
func SaveSupport(ctx context.Context, db *store.DB, s Support) error {
	return storeOnly(db).SetSupportSettings(ctx, s)
}

// storeOnly is a panel with nothing but its store, for the settings the
// panel keeps there, so that the command line reads and writes them with
// the panel's own code.
func storeOnly(db *store.DB) *Panel {
	return &Panel{cfg: Config{DB: db, Now: func() time.Time { return time.Now().UTC() }}}
}
