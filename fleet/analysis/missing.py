"""What a summary does with values it cannot use: a NaN or a null makes the figure missing.

Polars' `min` and `max` skip NaN (a NaN cosine would leave the minimum of the other rows, a
vacuous PASS), while `mean`, `sum` and `quantile` return NaN. Either way the figure would not say
that a row could not be measured. Every summary of fleet.analysis goes through these, so a NaN
anywhere in its rows makes the figure null, which a gate reports as "not measured" (a FAIL).
"""

from __future__ import annotations

import polars as pl


def has_nan(values: pl.Expr) -> pl.Expr:
    """Whether any value is NaN (booleans and integers never are; nulls are not NaN)."""
    return values.cast(pl.Float64).is_nan().any()


def no_nan(values: pl.Expr, agg: pl.Expr) -> pl.Expr:
    """`agg`, or null when `values` holds a NaN. Nulls keep their meaning (e.g. an unscored row)."""
    return pl.when(has_nan(values)).then(None).otherwise(agg)


def strict(column: str, agg: pl.Expr) -> pl.Expr:
    """`agg`, or null when `column` holds a null or a NaN: a summary never silently skips a pair."""
    values = pl.col(column)
    return pl.when((values.null_count() > 0) | has_nan(values)).then(None).otherwise(agg)
