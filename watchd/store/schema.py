"""The state database's schema: append-only migrations, one per version."""

from __future__ import annotations

# Each migration takes the schema from version N-1 to N, in one transaction with the version bump.
# Append only: a released migration is never edited.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 1: the first schema
        """CREATE TABLE audit (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL,
            rule TEXT NOT NULL,
            event_id TEXT NOT NULL,
            node TEXT NOT NULL,
            action TEXT NOT NULL,
            mode TEXT NOT NULL,
            outcome TEXT NOT NULL,
            detail TEXT NOT NULL,
            duration_s REAL NOT NULL,
            params TEXT NOT NULL
        )""",
        "CREATE INDEX audit_time ON audit (time)",
        "CREATE INDEX audit_node ON audit (node, id)",
        """CREATE TABLE intents (
            id INTEGER PRIMARY KEY,
            key TEXT NOT NULL,
            kind TEXT NOT NULL,
            node TEXT NOT NULL,
            rule TEXT NOT NULL,
            event_id TEXT NOT NULL,
            params TEXT NOT NULL,
            decided_at REAL NOT NULL,
            finished_at REAL,
            outcome TEXT,
            detail TEXT NOT NULL DEFAULT ''
        )""",
        # At most one unfinished intent per key, enforced by the database itself.
        "CREATE UNIQUE INDEX intents_in_flight ON intents (key) WHERE finished_at IS NULL",
        "CREATE INDEX intents_key ON intents (key, id)",
        "CREATE INDEX intents_finished ON intents (finished_at)",
        "CREATE TABLE cooldowns (key TEXT PRIMARY KEY, until REAL NOT NULL) WITHOUT ROWID",
        """CREATE TABLE disruptions (
            id INTEGER PRIMARY KEY,
            pool TEXT NOT NULL,
            node TEXT NOT NULL,
            at REAL NOT NULL
        )""",
        "CREATE INDEX disruptions_pool_at ON disruptions (pool, at)",
        "CREATE INDEX disruptions_at ON disruptions (at)",
        """CREATE TABLE held (
            id INTEGER PRIMARY KEY,
            rule TEXT NOT NULL,
            kind TEXT NOT NULL,
            node TEXT NOT NULL,
            pool TEXT NOT NULL,
            params TEXT NOT NULL,
            event TEXT NOT NULL,
            reason TEXT NOT NULL,
            held_at REAL NOT NULL,
            status TEXT NOT NULL DEFAULT 'held' CHECK (status IN ('held', 'released', 'discarded')),
            resolved_by TEXT NOT NULL DEFAULT '',
            resolved_at REAL
        )""",
        "CREATE INDEX held_status ON held (status, id)",
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
    ),
    (  # 2: what the rules remember (windows, holds, sightings, cooldowns), one JSON document per rule
        """CREATE TABLE rule_state (
            rule TEXT PRIMARY KEY,
            fingerprint TEXT NOT NULL,
            state TEXT NOT NULL,
            saved_at REAL NOT NULL
        ) WITHOUT ROWID""",
        # the alerts watchd has firing, so a restart re-fires them instead of letting the pages expire
        """CREATE TABLE firing_alerts (
            key TEXT PRIMARY KEY,
            alert TEXT NOT NULL,
            resolve_at REAL NOT NULL
        ) WITHOUT ROWID""",
    ),
    (  # 3: lookups that must not grow with the table: a held action by (kind, node), a node in the window
        "CREATE INDEX held_kind_node ON held (kind, node, id) WHERE status = 'held'",
        "CREATE INDEX held_resolved ON held (resolved_at) WHERE status != 'held'",
        "CREATE INDEX disruptions_pool_node_at ON disruptions (pool, node, at)",
    ),
    (  # active checks (nccl-tests, dcgmi diag, commands): rounds, runs, and where each node stands
        """CREATE TABLE check_rounds (
            check_name TEXT NOT NULL,
            round TEXT NOT NULL,
            scheduled_at REAL NOT NULL,
            started_at REAL NOT NULL,
            finished_at REAL,
            PRIMARY KEY (check_name, round)
        ) WITHOUT ROWID""",
        "CREATE INDEX check_rounds_started ON check_rounds (check_name, started_at)",
        """CREATE TABLE check_runs (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL UNIQUE,
            check_name TEXT NOT NULL,
            node TEXT NOT NULL,
            round TEXT NOT NULL,
            validation INTEGER NOT NULL DEFAULT 0,
            job_id TEXT NOT NULL DEFAULT '',
            job_output TEXT NOT NULL DEFAULT '',
            started_at REAL NOT NULL,
            finished_at REAL,
            outcome TEXT,
            evidence TEXT NOT NULL DEFAULT '',
            figures TEXT NOT NULL DEFAULT '{}'
        )""",
        "CREATE INDEX check_runs_node ON check_runs (node, id)",
        "CREATE INDEX check_runs_round ON check_runs (check_name, round)",
        "CREATE INDEX check_runs_unfinished ON check_runs (finished_at) WHERE finished_at IS NULL",
        """CREATE TABLE check_nodes (
            check_name TEXT NOT NULL,
            node TEXT NOT NULL,
            last_round TEXT NOT NULL DEFAULT '',
            last_run REAL,
            last_outcome TEXT NOT NULL DEFAULT '',
            last_success REAL,
            failures INTEGER NOT NULL DEFAULT 0,
            next_try REAL NOT NULL DEFAULT 0,
            PRIMARY KEY (check_name, node)
        ) WITHOUT ROWID""",
    ),
    (  # reliability accounting: node-hours in service, failures, what is known of each node
        """CREATE TABLE service_intervals (
            node TEXT NOT NULL,
            started_at REAL NOT NULL,
            ended_at REAL NOT NULL,
            PRIMARY KEY (node, started_at)
        ) WITHOUT ROWID""",
        "CREATE INDEX service_intervals_end ON service_intervals (ended_at)",
        """CREATE TABLE failures (
            id INTEGER PRIMARY KEY,
            time REAL NOT NULL,
            node TEXT NOT NULL,
            rule TEXT NOT NULL,
            event_id TEXT NOT NULL,
            evidence TEXT NOT NULL,
            gpu INTEGER,
            mode TEXT NOT NULL,
            back_at REAL
        )""",
        "CREATE INDEX failures_time ON failures (time)",
        "CREATE INDEX failures_open ON failures (node) WHERE back_at IS NULL",
        """CREATE TABLE service_nodes (
            node TEXT PRIMARY KEY,
            gpu_model TEXT,
            gpus INTEGER NOT NULL DEFAULT 0,
            partitions TEXT NOT NULL DEFAULT '',
            out_since REAL
        ) WITHOUT ROWID""",
    ),
    (  # HA: the database lease of the elected engine; its token fences every write
        """CREATE TABLE leader_lease (
            name TEXT PRIMARY KEY,
            holder TEXT NOT NULL DEFAULT '',
            token INTEGER NOT NULL DEFAULT 0,
            acquired_at REAL NOT NULL DEFAULT 0,
            expires_at REAL NOT NULL DEFAULT 0
        ) WITHOUT ROWID""",
    ),
    (  # usage report: what watchd observed per job GPU and day (energy, idle), job checkpoints
        """CREATE TABLE job_gpu_usage (
            job TEXT NOT NULL,
            node TEXT NOT NULL,
            gpu INTEGER NOT NULL,
            day REAL NOT NULL,
            energy_j REAL NOT NULL,
            gpu_s REAL NOT NULL,
            idle_s REAL NOT NULL,
            first REAL NOT NULL,
            last REAL NOT NULL,
            PRIMARY KEY (job, node, gpu, day)
        ) WITHOUT ROWID""",
        "CREATE INDEX job_gpu_usage_last ON job_gpu_usage (last)",
        """CREATE TABLE job_checkpoints (
            job TEXT NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (job, at)
        ) WITHOUT ROWID""",
    ),
    (  # what an action left, as data (requeued job ids, the spare released, a validation's verdicts)
        "ALTER TABLE audit ADD COLUMN result TEXT NOT NULL DEFAULT '{}'",
        "ALTER TABLE intents ADD COLUMN result TEXT NOT NULL DEFAULT '{}'",
    ),
    (  # a check job's output is taken only when it begins with the secret its script printed first
        "ALTER TABLE check_runs ADD COLUMN job_nonce TEXT NOT NULL DEFAULT ''",
    ),
    (  # what is held of each node for its remediations: those done, its marks, watchd's drain generation
        """CREATE TABLE node_remediations (
            id INTEGER PRIMARY KEY,
            node TEXT NOT NULL,
            kind TEXT NOT NULL,
            claim TEXT NOT NULL UNIQUE,
            rule TEXT NOT NULL,
            at REAL NOT NULL,
            outcome TEXT NOT NULL DEFAULT '',
            generation INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX node_remediations_node_at ON node_remediations (node, at)",
        "CREATE INDEX node_remediations_at ON node_remediations (at)",
        """CREATE TABLE node_marks (
            id INTEGER PRIMARY KEY,
            node TEXT NOT NULL,
            mark TEXT NOT NULL CHECK (mark IN ('lemon', 'left_for_a_person')),
            rule TEXT NOT NULL,
            detail TEXT NOT NULL,
            set_at REAL NOT NULL,
            gpu TEXT NOT NULL DEFAULT '',
            uuid TEXT NOT NULL DEFAULT '',
            gpus TEXT NOT NULL DEFAULT '{}',
            cleared_at REAL,
            cleared_by TEXT NOT NULL DEFAULT '',
            cleared_why TEXT NOT NULL DEFAULT ''
        )""",
        # at most one open mark of each kind per node, enforced by the database itself
        "CREATE UNIQUE INDEX node_marks_open ON node_marks (node, mark) WHERE cleared_at IS NULL",
        "CREATE INDEX node_marks_node ON node_marks (node, id)",
        """CREATE TABLE node_drains (
            node TEXT PRIMARY KEY,
            generation INTEGER NOT NULL,
            drained_at REAL NOT NULL
        ) WITHOUT ROWID""",
    ),
    (  # which run of a node's agent a command was first handed to (a GPU reset runs at most once)
        """CREATE TABLE command_bindings (
            command_id TEXT PRIMARY KEY,
            node TEXT NOT NULL,
            instance TEXT NOT NULL,
            bound_at REAL NOT NULL,
            finished_at REAL
        ) WITHOUT ROWID""",
        "CREATE INDEX command_bindings_bound ON command_bindings (bound_at)",
        "CREATE INDEX command_bindings_finished ON command_bindings (finished_at)",
    ),
)
SCHEMA_VERSION = len(MIGRATIONS)
