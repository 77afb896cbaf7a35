-- compute_servers_task (0004) indexed task_state for the reconcile loop's
-- resume, which finds owed work through work_due (0071) now. No query
-- selects by a task state alone (the power sync's task_state = '' is most
-- rows; a status filter goes by project first), and every step that
-- changed a server's task, several per server created, paid for it.
DROP INDEX compute_servers_task
