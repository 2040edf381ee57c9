"""A candidate's token rows with the reference's scores beside them, and the one check of logprobs
every write path makes: used where the rows are (the driver, or an actor that stores or encodes them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet.contracts import schema

if TYPE_CHECKING:
    import pyarrow as pa


def non_finite(tokens: pa.Table) -> bool:
    """Some logprob is NaN or infinite (null ones aside)."""
    import pyarrow.compute as pc

    lp = tokens.column("logprob")
    return bool(len(lp)) and not pc.all(pc.is_finite(lp.fill_null(0.0))).as_py()


def join_scores(tokens: pa.Table, scores: pa.Table, *, into: pa.Schema = schema.TOKENS) -> pa.Table:
    """A candidate's token rows with the reference's SCORES columns joined on (prompt_id, position),
    as table `into` (the tokens table, or parity under load's load_tokens).
    Scores in the tokens' own row order (what the engines return) are put beside them as they are."""
    import polars as pl

    keys = ["prompt_id", "position"]
    if tokens.select(keys).equals(scores.select(keys)):  # no join: a comparison of two key columns
        columns = {c: scores.column(c) for c in schema.SCORE_COLUMNS if c in scores.column_names}
        beside = tokens.drop_columns([c for c in schema.SCORE_COLUMNS if c in tokens.column_names])
        for name, column in columns.items():
            beside = beside.append_column(name, column)
        return schema.conform(beside, into)
    joined = (
        pl.from_arrow(tokens)
        .drop(schema.SCORE_COLUMNS)  # type: ignore[union-attr]
        .join(pl.from_arrow(scores), on=keys, how="left", maintain_order="left")  # type: ignore[arg-type]
    )
    return schema.conform(joined.to_arrow(), into)
