"""Shards the actors encode and the driver stores (fleet/results/packed.py): the files are the
ones the driver would have written from the rows itself, byte for byte, on every route a shard
takes (the reference's own, a candidate's scored in the reference's actor, staged while the
targets take turns, an empty one). Runs on the labelled test double; the scheduler's tests and
the fault tests run the same path through a whole run (fake and real Ray)."""

from __future__ import annotations

import functools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from actors.test_double import TestDoubleEngine
from fleet.contracts.backend_args import TestDoubleArgs
from fleet.contracts.engine import Generation, ResolvedModel
from fleet.contracts.prompts import Prompt
from fleet.contracts.sources import SyntheticSource
from fleet.contracts.spec import ModelSpec, Sampling, Shard
from fleet.results import prompt_rows
from fleet.results.packed import WHOLE, PackSink
from fleet.results.scores import join_scores
from fleet.results.staging import Staging
from fleet.results.store import RunStore

RUN_ID = "r1"


def double_engines(where: Path) -> tuple[TestDoubleEngine, TestDoubleEngine]:
    """A test-double reference and candidate of one model (no weights are read from `where`)."""
    model = ResolvedModel(ModelSpec(name="m", source=SyntheticSource()), where, "w" * 16, None)
    sampling = Sampling(max_tokens=12, logprobs=3)
    ref = TestDoubleEngine(TestDoubleArgs(name="ref"), model, sampling=sampling)
    cand = TestDoubleEngine(TestDoubleArgs(name="cand", logprob_shift=0.01), model, sampling=sampling)
    return ref, cand


@pytest.fixture
def engines(tmp_path: Path) -> tuple[TestDoubleEngine, TestDoubleEngine]:
    return double_engines(tmp_path)


def shard_of(target: str, n: int = 40) -> Shard:
    return Shard("m", target, "p", 0, tuple(Prompt(id=f"q{i}", prompt=f"question {i}") for i in range(n)))


def _store(tmp_path: Path, name: str) -> RunStore:
    store = RunStore.create(tmp_path / name, {"run_id": RUN_ID})
    return store


def _files(store: RunStore) -> dict[str, bytes]:
    """Every stored file's rows (metadata aside), by its path under the run directory."""
    root = Path(store.root)
    out = {}
    for path in sorted(root.glob("**/*.parquet")):
        table = pq.read_table(path)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="none", use_dictionary=False)
        out[str(path.relative_to(root))] = sink.getvalue().to_pybytes()
    return out


def _driver_wrote(store: RunStore, gen: Generation, tokens: pa.Table) -> None:
    """What ShardWriter.write stores for rows the driver holds."""
    shard_id = gen.shard.column("shard_id")[0].as_py()
    store.write("requests", shard_id, gen.requests)
    store.write("tokens", shard_id, tokens)
    store.write("prompt_stats", shard_id, prompt_rows.summarize(tokens))
    store.write("shards", shard_id, gen.shard)


def _committed(store: RunStore, packed: object) -> None:
    """What ShardWriter.commit stores for a Packed."""
    for table in WHOLE:
        store.put_encoded(table, packed.shard_id, *packed.files[table])  # type: ignore[attr-defined]
    store.write("shards", packed.shard_id, packed.shard)  # type: ignore[attr-defined]


def test_packed_shards_store_what_the_driver_would_have_written(
    engines: tuple[TestDoubleEngine, TestDoubleEngine], tmp_path: Path
) -> None:
    ref, cand = engines
    sink = PackSink(RUN_ID, reference="ref")
    by_driver, by_actors = _store(tmp_path, "driver"), _store(tmp_path, "actors")

    own = ref.generate(shard_of("ref"))
    _driver_wrote(by_driver, own, own.tokens)
    packed = sink.generated(own)
    assert packed.whole and packed.tokens == own.tokens.num_rows and not packed.non_finite
    _committed(by_actors, packed)

    gen = cand.generate(shard_of("cand"))
    _driver_wrote(by_driver, gen, join_scores(gen.tokens, ref.score(gen.requests, k=3)))
    generated = sink.generated(gen)
    assert not generated.whole and set(generated.files) == {"requests", "tokens"}
    scored = sink.scored(generated, functools.partial(ref.score, k=3))
    assert scored.whole
    _committed(by_actors, scored)

    driver_files, actor_files = _files(by_driver), _files(by_actors)
    assert len(driver_files) == 8 and driver_files == actor_files


def test_a_staged_packed_shard_reads_back_as_it_was_put(
    engines: tuple[TestDoubleEngine, TestDoubleEngine], tmp_path: Path
) -> None:
    """Taking turns: a candidate's encoded shard waits in the staging area, then goes to the
    reference's actor from there, the same bytes; an empty table keeps its own weights ("none")."""
    _, cand = engines
    store, sink = _store(tmp_path, "run"), PackSink(RUN_ID, reference="ref")
    gen = cand.generate(shard_of("cand"))
    empty = Generation(gen.requests, gen.tokens.slice(0, 0), gen.shard)
    for rows in (gen, empty):
        packed = sink.generated(rows)
        staging = Staging(store)
        weights = staging.put(packed)
        back = staging.packed(packed.shard_id, weights)
        keys = ["shard_id", "model_weights", "n_output_tokens"]
        assert back.files == packed.files and back.shard.select(keys).equals(packed.shard.select(keys))
        assert back.generation().tokens.num_rows == rows.tokens.num_rows
        staging.drop(packed.shard_id, weights)
    assert sink.generated(empty).files["tokens"][0] == "none"


def test_on_the_driver_path_the_driver_neither_summarises_nor_encodes_rows(
    local_ray: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A whole run on the session's Ray (the test double's actors are processes of their own): in
    the driver, summarising a shard fails and every table it encodes is recorded. The run completes,
    every shard scored, and the driver encoded only `shards` rows and run-level tables."""
    from conftest import DOUBLE_MANIFEST

    from fleet.results import reader
    from fleet.run import driver

    def refused(tokens: pa.Table) -> pa.Table:
        raise AssertionError("the driver summarised a shard")

    encoded_here: list[str] = []
    write = RunStore.write

    def recorded(self: RunStore, table: str, *args: object, **kwargs: object) -> object:
        encoded_here.append(table)
        return write(self, table, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(prompt_rows, "summarize", refused)
    monkeypatch.setattr(RunStore, "write", recorded)
    manifest = tmp_path / "m.yaml"
    manifest.write_text(DOUBLE_MANIFEST)
    run_dir, outcome = driver.run(manifest, results_dir=tmp_path / "results", run_id="packed", progress=False)
    assert not outcome.failures and not outcome.failed_shards
    assert set(encoded_here) <= {"shards"}, encoded_here
    tokens = reader.load(run_dir)["tokens"].collect()
    cand = tokens.filter(tokens["target"] == "cand")
    assert cand.height > 0 and cand["ref_logprob"].null_count() == 0  # scored, in the reference's actor
    assert reader.load(run_dir)["prompt_stats"].collect().height == 2 * 3  # 3 prompts, both targets
