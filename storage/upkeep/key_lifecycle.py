"""Which of a tenant's keys still hold state, as their latest `tenant_status` rows say.

`tenants offboard --wait` polls this: a key whose latest row is `active` (or from before the
`lifecycle` column, null) still has state in the stream; `offboarded` means its windows got
their final panes and its state was dropped; `configured` means it never had state.
"""

from __future__ import annotations

import pyarrow.compute as pc
import pyarrow.dataset as ds

from storage.lake.delta_lake import DeltaLake
from storage.lake.tables import TENANT_STATUS

_STATELESS = ("offboarded", "configured")


def sources_with_state(lake: DeltaLake, tenant_id: str) -> list[str]:
    """The sources of `tenant_id` whose latest `tenant_status` row says the key has state."""
    rows = lake.read_arrow(
        TENANT_STATUS,
        columns=["tenant", "source", "batch_id", "lifecycle"],
        row_filter=ds.field("tenant") == tenant_id,
        tenant=tenant_id,
    )
    if rows.num_rows == 0:
        return []
    # Latest per source: by batch id, and within a batch an `offboarded` row ends the key.
    offboarded = pc.fill_null(pc.equal(rows["lifecycle"], "offboarded"), False)
    rank = pc.if_else(offboarded, 1, 0)
    ordered = rows.append_column("rank", rank).sort_by(
        [("source", "ascending"), ("batch_id", "descending"), ("rank", "descending")]
    )
    latest: dict[str, str | None] = {}
    for source, lifecycle in zip(
        ordered["source"].to_pylist(), ordered["lifecycle"].to_pylist(), strict=True
    ):
        latest.setdefault(source, lifecycle)
    return sorted(source for source, lifecycle in latest.items() if lifecycle not in _STATELESS)
