package panel

// The support requests' words: the customer's bounds and requests, and the
// operator's queue and view by customer.
func init() {
	addRU(map[string]string{
		"Your project has %d open requests, as many as it may. Close one you no longer need, or wait for an answer.": "У проекта %d открытых заявок — это предел. Закройте ненужную или дождитесь ответа.",
		"Your project has sent %d requests in the last hour, as many as it may. Try again later.":                    "Проект отправил %d заявок за последний час — это предел. Попробуйте позже.",
		"A project may have %d open requests and send %d in an hour.":                                                "У проекта может быть до %d открытых заявок и до %d новых в час.",
		"The request is closed.":                                                    "Заявка закрыта.",
		"The request is open again.":                                                "Заявка снова открыта.",
		"The page marker is not valid; start from the first page.":                  "Метка страницы неверна; начните с первой страницы.",
		"Show open, closed or all requests.":                                        "Покажите открытые, закрытые или все заявки.",
		"Support requests":                                                          "Заявки в поддержку",
		"Support requests by customer":                                              "Заявки в поддержку по клиентам",
		"Customers' requests by customer and newest first; close what is answered.": "Заявки клиентов: по клиентам и сначала новые; закрывайте отвеченные.",
		"%d open requests from %d customers.":                                       "Открытых заявок: %d, от клиентов: %d.",
		"Every request, newest first":                                               "Все заявки, сначала новые",
		"By customer":                                                               "По клиентам",
		"Every customer":                                                            "Все клиенты",
		"Every customer's":                                                          "Заявки всех клиентов",
		"More customers":                                                            "Ещё клиенты",
		"The requests of %s only.":                                                  "Только заявки %s.",
		"The customer's account":                                                    "Счёт клиента",
		"Customer":                                                                  "Клиент",
		"Requests":                                                                  "Заявки",
		"Newest":                                                                    "Последняя",
		"Open":                                                                      "Открытые",
		"Closed":                                                                    "Закрытые",
		"All":                                                                       "Все",
		"Show":                                                                      "Показать",
		"open":                                                                      "открыта",
		"closed":                                                                    "закрыта",
		"Close":                                                                     "Закрыть",
		"Reopen":                                                                    "Открыть снова",
		"First page":                                                                "Первая страница",
		"Older requests":                                                            "Более ранние заявки",
	})
}
