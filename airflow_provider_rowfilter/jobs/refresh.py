"""RefreshPublication: reconcile a subscription with its publications (``ALTER SUBSCRIPTION … REFRESH PUBLICATION``).

Validate the definitions (and change nothing when they are invalid), make the capture publication
publish the subscribed tables' leaves, create the slot if missing, then, in one subscriber
transaction: a new table gets ``i`` (``r`` at the current position with ``copy_data: false``), a table
no longer published is removed with its progress, and the definitions are recorded with the
position from which they apply. Running it twice changes nothing the second time.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from airflow_provider_rowfilter.core.spec import SubscriptionSpec
from airflow_provider_rowfilter.core.subscription_filters import filters_document, subscribed_tables
from airflow_provider_rowfilter.jobs.arguments import parse, parser
from airflow_provider_rowfilter.pg.change_log import ChangeLog
from airflow_provider_rowfilter.pg.definitions import connect, load_definitions
from airflow_provider_rowfilter.pg.publisher import (
    capture_names,
    current_lsn,
    ensure_capture_publication,
    ensure_slot,
)
from airflow_provider_rowfilter.pg.state import StateStore, migrate

log = logging.getLogger(__name__)


@dataclass
class RefreshResult:
    subscription: str
    lsn: str
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    tables: list[str] = field(default_factory=list)
    slot_created: bool = False
    capture_publication_changed: bool = False
    definitions_changed: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.slot_created or self.capture_publication_changed
                    or self.definitions_changed)


def refresh(spec: SubscriptionSpec) -> RefreshResult:
    """Run RefreshPublication for ``spec``; raise (having changed nothing) when the definitions are invalid."""
    slot, capture = capture_names(spec.subscription)
    with connect(spec.publisher, "publisher", spec) as pub:
        definitions = load_definitions(spec, pub)
        tables = subscribed_tables(definitions.publications, spec.publications, definitions.catalog)
        leaves = sorted({leaf for t in definitions.filters.tables.values() for leaf in t.leaves})
        # The publication first: pgoutput decodes each change with the catalog as of its position.
        publication_changed = ensure_capture_publication(pub, capture, spec.subscription, leaves)
        slot_created = ensure_slot(pub, slot)
        lsn = current_lsn(pub)
    if slot_created:
        set_aside = ChangeLog(spec.change_log_dir()).set_aside()
        if set_aside is not None:
            log.warning("a new slot %s was created: the change log of the previous one was moved to %s", slot, set_aside)
    document = filters_document(definitions.filters, spec.subscription)
    result = RefreshResult(spec.subscription, lsn, tables=[str(t) for t in tables], slot_created=slot_created,
                           capture_publication_changed=publication_changed)
    with connect(spec.subscriber, "subscriber", spec) as sub:
        migrate(sub)
        store = StateStore(sub, spec.subscription)
        with sub.transaction():
            store.ensure_subscription(spec.publications, slot, capture, {"copy_data": spec.copy_data})
            added, removed = store.reconcile(tables, copy_data=spec.copy_data, current_lsn=lsn)
            last = sub.execute(
                "SELECT definitions FROM rowfilter.refresh_history WHERE subscription = %s ORDER BY id DESC LIMIT 1",
                (spec.subscription,)).fetchone()
            result.definitions_changed = last is None or last[0] != document
            if added or removed or result.definitions_changed:
                store.record_refresh(lsn, added, removed, document)
    result.added = [str(t) for t in added]
    result.removed = [str(t) for t in removed]
    log.info("refresh of %s at %s: added %s, removed %s", spec.subscription, lsn, result.added, result.removed)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for spark-submit and ``python -m``: prints the result as JSON."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    _, spec = parse(parser(__doc__.splitlines()[0]), argv)
    result = refresh(spec)
    print(json.dumps({**result.__dict__, "changed": result.changed}))
    return 0



if __name__ == "__main__":
    sys.exit(main())
