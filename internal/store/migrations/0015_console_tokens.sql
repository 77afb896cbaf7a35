-- Console tokens (internal/compute/consoles.go): a remote-consoles call
-- answers a URL that carries a random token; only the token's SHA-256 is
-- kept, as token_hash. The console proxy (internal/console) looks the
-- token up and reaches the server's VNC console at its host's relay
-- (host, port), which lets it in for the line secret + "\n". A token
-- works until expires_at (Nova's [consoleauth] token_ttl), and only while
-- its server lives on compute_host.
CREATE TABLE compute_console_tokens (
    token_hash   TEXT PRIMARY KEY,
    server_id    TEXT NOT NULL,
    project_id   TEXT NOT NULL,
    compute_host TEXT NOT NULL,
    console_type TEXT NOT NULL,
    host         TEXT NOT NULL,
    port         INTEGER NOT NULL,
    secret       TEXT NOT NULL,
    expires_at   TEXT NOT NULL,
    created_at   TEXT NOT NULL
)
-- next
CREATE INDEX compute_console_tokens_expires ON compute_console_tokens (expires_at)
-- next
CREATE INDEX compute_console_tokens_server ON compute_console_tokens (server_id)
