-- work_due is 1 while the reconcile loop owes a server a step (a task, a
-- build, a volume op: compute's stepFor), written by every save of the
-- row, so that any controller finds owed work from the recorded state
-- through a small index instead of reading every document.
ALTER TABLE compute_servers ADD COLUMN work_due INTEGER NOT NULL DEFAULT 0
-- next
UPDATE compute_servers SET work_due = 1 WHERE deleted = 0
 AND (task_state <> '' OR vm_state = 'building' OR doc LIKE '%"volume_ops":[%')
-- next
CREATE INDEX compute_servers_work_due ON compute_servers (id) WHERE work_due = 1
