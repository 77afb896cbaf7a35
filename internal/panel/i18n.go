package panel

import "fmt"

// ru holds the Russian text of each English string the panel shows; each
// area's file adds its own with addRU. A string without a translation is
// shown in English.
var ru = map[string]string{}

func addRU(m map[string]string) {
	for k, v := range m {
		ru[k] = v
	}
}

func translate(lang, s string, args ...any) string {
	if lang == "ru" {
		if t, ok := ru[s]; ok {
			s = t
		}
	}
	if len(args) > 0 {
		return fmt.Sprintf(s, args...)
	}
	return s
}

func init() {
	addRU(map[string]string{
		"Servers":         "Серверы",
		"Create server":   "Создать сервер",
		"Volumes":         "Диски",
		"Backups":         "Резервные копии",
		"Networks":        "Сети",
		"SSH keys":        "SSH-ключи",
		"Floating IPs":    "Публичные IP",
		"Billing":         "Баланс",
		"API access":      "Доступ к API",
		"Support":         "Поддержка",
		"Operator":        "Оператор",
		"Prices":          "Цены",
		"Sign in":         "Войти",
		"Sign out":        "Выйти",
		"Sign up":         "Регистрация",
		"E-mail":          "Эл. почта",
		"Password":        "Пароль",
		"Error":           "Ошибка",
		"Main menu":       "Главное меню",
		"Skip to content": "Перейти к содержимому",
		"Language":        "Язык",
		"Details":         "Подробнее",
		"Top-ups are made through the operator: see Support for how to pay.": "Пополнение — через оператора: как оплатить, смотрите в разделе «Поддержка».",
		"Back":                      "Назад",
		"Wrong e-mail or password.": "Неверная эл. почта или пароль.",
		"Virtual servers with dedicated vCPUs and GPUs, billed by the hour.": "Виртуальные серверы с выделенными vCPU и GPU, с почасовой оплатой.",
		"Configure a server":           "Собрать сервер",
		"See the prices":               "Посмотреть цены",
		"Signed in as %s":              "Вы вошли как %s",
		"Forgot your password?":        "Забыли пароль?",
		"No account yet?":              "Ещё нет аккаунта?",
		"The page could not be found.": "Страница не найдена.",
		"Something went wrong on our side. Try again in a moment.":                             "Что-то пошло не так на нашей стороне. Попробуйте ещё раз через минуту.",
		"The service is briefly unavailable. Try again in a moment.":                           "Сервис ненадолго недоступен. Попробуйте ещё раз через минуту.",
		"The form has expired or did not come from this panel. Reload the page and try again.": "Форма устарела или отправлена не из этой панели. Обновите страницу и попробуйте снова.",
	})
}
