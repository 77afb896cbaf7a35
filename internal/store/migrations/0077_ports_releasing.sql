-- releasing is 1 on a port bound to a server whose delete was accepted:
-- compute releases it once the VM is gone. A security group, subnet or
-- network delete that only such ports block waits for them (bounded)
-- instead of answering 409 for a race the client cannot see.
ALTER TABLE ports ADD COLUMN releasing INTEGER NOT NULL DEFAULT 0
