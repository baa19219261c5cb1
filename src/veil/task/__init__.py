"""Task definitions: what a task fixes, and its TOML files for each party.

A task (DAP section 4.2) fixes the VDAF with its parameters, the time
precision, min_batch_size, the validity window, the DP parameters, the
collector's HPKE public key, the aggregators' shared verify key and the bearer
tokens. Parameters are immutable; each party holds only what it needs:

- leader:    everything public, verify key, the aggregator token (to send),
             the SHA-256 of the collector token (to check);
- helper:    everything public, verify key, the SHA-256 of the aggregator token;
- collector: everything public, the collector token and HPKE private key;
- client:    everything public.

Each is its own type (`LeaderTask`, `HelperTask`, `CollectorTask`,
`ClientTask`) with its secrets required, and each file declares its role
(`role = "leader"` ...): a file without it is refused with the line to add.

Bytes are written as unpadded base64url strings.

A task served over DAP instead of veil's gRPC protocol has a `[dap]` table
(`DapSpec`: the draft, task_info and the aggregators' DAP endpoints), from
which `Task.dap_configuration` builds DAP's TaskConfiguration.

The modules: `common` (defaults, the error, base64url and tokens), `spec`
(`VdafSpec`, `DpSpec`, `DapSpec`), `roles` (`Task` and the four role types), `files`
(`load_task`, `write_toml`, `new_task`). Their public names are exported
here: the rest of veil imports a task's types from `veil.task`.
"""

from veil.task.common import (
    DEFAULT_DP_MODE,
    DEFAULT_MAX_CLOCK_SKEW,
    DEFAULT_MIN_BATCH_SIZE,
    DEFAULT_NOT_AFTER,
    DEFAULT_NOT_BEFORE,
    DEFAULT_TIME_PRECISION,
    MAX_QUERY_PREFIXES,
    OPEN_ENDED,
    TASK_ID_SIZE,
    VDAF_TYPES,
    TaskError,
    b64d,
    b64e,
    hash_token,
    token_matches,
)
from veil.task.files import (
    TaskFiles,
    expect_role,
    load_task,
    new_task,
    write_toml,
)
from veil.task.roles import (
    AggregatorTask,
    ClientTask,
    CollectorTask,
    HelperTask,
    LeaderTask,
    Task,
    retirement_margin,
)
from veil.task.spec import (
    DapSpec,
    DpSpec,
    VdafSpec,
)

__all__ = [
    "DEFAULT_DP_MODE",
    "DEFAULT_MAX_CLOCK_SKEW",
    "DEFAULT_MIN_BATCH_SIZE",
    "DEFAULT_NOT_AFTER",
    "DEFAULT_NOT_BEFORE",
    "DEFAULT_TIME_PRECISION",
    "MAX_QUERY_PREFIXES",
    "OPEN_ENDED",
    "TASK_ID_SIZE",
    "VDAF_TYPES",
    "AggregatorTask",
    "ClientTask",
    "CollectorTask",
    "DapSpec",
    "DpSpec",
    "HelperTask",
    "LeaderTask",
    "Task",
    "TaskError",
    "TaskFiles",
    "VdafSpec",
    "b64d",
    "b64e",
    "expect_role",
    "hash_token",
    "load_task",
    "new_task",
    "retirement_margin",
    "token_matches",
    "write_toml",
]
