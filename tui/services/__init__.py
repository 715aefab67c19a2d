"""Services: actions on a host and on local files, below the views and the CLI, above
state/protocol/transport. No Textual or Rich here (tests/test_import_hygiene.py).

`actions` (configure, snapshot, launch, relaunch, kill, prune over an AgentClient),
`patches` (patch status/push/rollback/capture), `ledger` (past runs' summaries),
`config` (eagle3.toml), `demo` (the embedded tiny run), `headless` (follow a run
without a screen), `inspect` (post-mortem of a log), `notify` (bell, desktop, hook),
`files` (the client's one atomic write).
"""
