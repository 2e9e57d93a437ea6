"""Several posteriors of one model (families to fit, baselines, posteriors already made) scored
on the same test data and tabulated: what each row is and what makes it (``rows``), the table
(``table``)."""

from zoo.comparison.rows import ENSEMBLE_OPTIONS, PRODUCERS, Producer, Row, check_row, rows_of
from zoo.comparison.table import (
    OBJECTIVE_LABELS,
    ReferenceNotConvergedWarning,
    compare,
    warn_unconverged,
)

__all__ = [
    "ENSEMBLE_OPTIONS",
    "OBJECTIVE_LABELS",
    "PRODUCERS",
    "Producer",
    "ReferenceNotConvergedWarning",
    "Row",
    "check_row",
    "compare",
    "rows_of",
    "warn_unconverged",
]
