"""One error tree for the package, rooted in :class:`RowFilterError`.

Errors carry PostgreSQL's own wording in ``message``/``detail`` (so users can search for it) and our
context on top: the publication, the table, the position inside the expression, and the fix.
Constructors only store fields; nothing here has side effects.
"""

from __future__ import annotations


class RowFilterError(Exception):
    """Root of every error raised by airflow-provider-rowfilter."""

    #: A later run may succeed with nothing changed (another job holds a lock): jobs/exit_status.py.
    transient: bool = False

    def __init__(
        self,
        message: str,
        *,
        detail: str | None = None,
        hint: str | None = None,
        publication: str | None = None,
        table: str | None = None,
        position: int | None = None,
        source: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.hint = hint
        self.publication = publication
        self.table = table
        self.position = position
        self.source = source

    def __str__(self) -> str:
        where = []
        if self.publication:
            where.append(f"publication {self.publication!r}")
        if self.table:
            where.append(f"table {self.table}")
        text = self.message
        if where:
            text = f"{', '.join(where)}: {text}"
        if self.source is not None and self.position is not None:
            text += self._caret()
        if self.detail:
            text += f"\nDETAIL:  {self.detail}"
        if self.hint:
            text += f"\nHINT:  {self.hint}"
        return text

    def _caret(self) -> str:
        """The line of ``source`` holding ``position`` and a caret under it (psql's ``LINE n:`` when several)."""
        assert self.source is not None and self.position is not None
        offset = max(self.position - 1, 0)
        start = self.source.rfind("\n", 0, offset) + 1
        end = self.source.find("\n", offset)
        line = self.source[start : end if end >= 0 else len(self.source)]
        prefix = f"LINE {self.source.count(chr(10), 0, start) + 1}: " if "\n" in self.source.rstrip("\n") else ""
        return f"\n  {prefix}{line}\n  {' ' * (len(prefix) + offset - start)}^"

    def with_context(self, *, publication: str | None = None, table: str | None = None) -> RowFilterError:
        """Return this error with the publication and table filled in where still unknown."""
        self.publication = self.publication or publication
        self.table = self.table or table
        return self


class SpecError(RowFilterError):
    """The subscription spec file is missing, malformed, or inconsistent."""


class PublicationError(RowFilterError):
    """A publication definition is invalid (PostgreSQL would reject it, or it names unknown objects)."""


class PublicationSyntaxError(PublicationError):
    """A ``CREATE``/``ALTER PUBLICATION`` statement or a row filter does not parse."""


class InvalidRowFilterError(PublicationError):
    """A row filter breaks PostgreSQL's restrictions (``invalid publication WHERE expression`` and kin)."""


class ReplicaIdentityError(PublicationError):
    """A row filter or column list does not fit the table's replica identity for UPDATE/DELETE."""


class ColumnListConflictError(PublicationError):
    """Publications of one subscription use different column lists for the same table."""


class UntranslatableFilterError(PublicationError):
    """A valid PostgreSQL row filter that Spark cannot evaluate with exactly PostgreSQL's meaning."""


class CatalogError(RowFilterError):
    """The publisher's catalog could not be read, or lacks what a definition refers to."""


class UnreachableError(CatalogError):
    """No session could be opened to the publisher or the subscriber (libpq's reason in the DETAIL)."""


class SparkUnavailableError(RowFilterError):
    """The Spark Connect server of ``spark_remote`` cannot be reached; a later run may find it up."""

    transient = True


class SparkAuthenticationError(RowFilterError):
    """The Spark Connect server of ``spark_remote`` refused the job's token (or its lack of one): a retry
    would meet the same refusal; the error names where the job looked for the token and the fix."""


class ApplyError(RowFilterError):
    """The batch cannot be applied (nothing of it was)."""
