"""A run directory: Parquet tables partitioned by model and target, plus run.json; local or remote.

Layout (results/README.md), Hive-style so that Polars, DuckDB, Spark and Trino read it as is:
    <run_dir>/<table>/model=<model>/model_weights=<weights>/target=<target>/<prompt_set>-<chunk>.parquet
Every file also carries those key columns and `run_id`, so a plain glob reads it too.
A run directory is a local path or a URI pyarrow has a filesystem for (s3://bucket/prefix/run_id;
`locate` says how the endpoint is chosen). A file appears whole or not at all, so a crash never
leaves a half-written file under a name that readers pick up (fleet/results/atomic.py); on an object
store a Parquet file is built in memory and put in one request.
run.json says whether the run finished; each write of it also updates the catalog of the results
root the run is in (<results_root>/_catalog, fleet/results/catalog_files.py), which `fleet runs`
reads instead of every run.json.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from fleet.contracts import schema, stored_tables
from fleet.contracts.errors import UserError
from fleet.contracts.inputs import inside
from fleet.contracts.spec import PROBE_KINDS
from fleet.results import catalog_files
from fleet.results.atomic import put, refused, written_beside

RUN_JSON = "run.json"
# Where rows wait uncommitted (fleet/results/staging.py): a dot directory, which no reader lists.
STAGING = ".staging"
# Where an actor's whole shard waits for the driver to commit it (fleet/results/direct.py).
READY = f"{STAGING}/ready"
# The S3 endpoint, first found wins: ours, then the AWS SDK's standard names, which pyarrow's
# S3FileSystem (26) does not read itself. Credentials and region come from the usual AWS_* names.
S3_ENDPOINT_VARS = ("FLEET_S3_ENDPOINT", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def locate(where: str | Path) -> tuple[pafs.FileSystem, str]:
    """The filesystem holding `where` (a local path, or a URI such as s3://bucket/prefix) and the
    path on it. For s3:// the endpoint is the first of S3_ENDPOINT_VARS set, unless the URI gives
    `?endpoint_override=`; any other S3FileSystem option can be given as a query parameter too."""
    text = os.fspath(where)
    if "://" not in text:
        if re.match(r"[a-z][a-z0-9+.-]+:/", text):  # pathlib.Path turns s3://b/p into s3:/b/p
            msg = f"{text}: a URI that lost a slash (passed through pathlib.Path?)"
            raise UserError(msg)
        return pafs.LocalFileSystem(), Path(text).absolute().as_posix()
    uri = urlsplit(text)
    if uri.scheme == "s3":
        # Delayed open: an object smaller than a part goes up in one PUT instead of a multipart upload.
        options = {"allow_delayed_open": "true"}
        endpoint = next((os.environ[v] for v in S3_ENDPOINT_VARS if os.environ.get(v)), None)
        if endpoint:
            options["endpoint_override"] = endpoint
        options = {k: v for k, v in options.items() if k not in parse_qs(uri.query)}
        text = urlunsplit(uri._replace(query="&".join(filter(None, [uri.query, urlencode(options)]))))
    try:
        fs, path = pafs.FileSystem.from_uri(text)
    except (ValueError, OSError) as e:
        raise UserError(f"{where}: {e}") from None
    return fs, path.rstrip("/")


def join(where: str | Path, *parts: str) -> str | Path:
    """`where`/parts in the form `where` came in: a Path, a local path string or a URI (query kept)."""
    if isinstance(where, Path):
        return where.joinpath(*parts)
    if "://" not in where:
        return str(Path(where).joinpath(*parts))
    uri = urlsplit(where)
    return urlunsplit(uri._replace(path="/".join([uri.path.rstrip("/"), *parts])))


def parquet_files(fs: pafs.FileSystem, path: str) -> list[str]:
    """Every .parquet file under `path` in path order (none if it does not exist), temp files left out."""
    found = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    files = [f.path for f in found if f.type == pafs.FileType.File and f.base_name.endswith(".parquet")]
    return sorted((f for f in files if not f.rsplit("/", 1)[-1].startswith(".")), key=lambda f: f.split("/"))


class RunStore:
    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = run_dir  # as given, for messages and paths handed back
        self.fs, self.root = locate(run_dir)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self._run_id: str | None = None

    @classmethod
    def create(cls, run_dir: str | Path, info: dict[str, Any]) -> RunStore:
        """A new, empty run directory; refuses to reuse one that exists. (On an object store the
        check and the first write are two requests: two drivers racing for one run id both pass.)"""
        store = cls(run_dir)
        if store.exists():
            msg = f"{run_dir}: run directory already exists; choose another --run-id"
            raise FileExistsError(msg)
        store.write_info(info | {"status": "running", "started_at": now(), "schema_version": schema.SCHEMA_VERSION})
        return store

    def exists(self) -> bool:
        """Whether anything is there: a directory, or on an object store any object under the prefix."""
        return self.fs.get_file_info(self.root).type != pafs.FileType.NotFound

    def shard_path(self, table: str, shard_id: str, weights: str, *, staged: bool = False) -> str | Path:
        """Where write() puts it, in the form run_dir was given (a Path stays a Path)."""
        return join(self.run_dir, *([STAGING] if staged else []), *_layout(table, shard_id, weights))

    def path(self, table: str, shard_id: str, weights: str, *, staged: bool = False, area: str | None = None) -> str:
        """Where write() puts it, as a path on self.fs. `area`: under that directory of the run
        (READY), `staged`: under STAGING, else in the table itself."""
        area = area or (STAGING if staged else None)
        return "/".join([self.root, *([area] if area else []), *_layout(table, shard_id, weights)])

    def write(
        self, table: str, shard_id: str, data: pa.Table, *, staged: bool = False, area: str | None = None
    ) -> str | Path:
        """Write one shard's rows of `table`, conformed to its declared schema, under the
        weights it ran on: a model name reused for other weights lands in another directory.
        `staged`: in the staging area, uncommitted (fleet/results/staging.py); `area`: under that
        directory of the run (READY: waiting for the driver's commit, fleet/results/direct.py)."""
        data = stamped(table, data, self.run_id)
        weights = stored_under(data)
        path = self.path(table, shard_id, weights, staged=staged, area=area)
        # The names in it are validated already; this is the guard that the layout stays in the run.
        inside(self.root, path, what=f"{table} rows of {shard_id[:200]}", local=self.local)
        if self.local:  # straight to the temp file: no in-memory copy of a big shard
            with written_beside(self.fs, path) as tmp:
                pq.write_table(data, tmp, **_options(data.schema))
        else:
            put(self.fs, path, encoded(data))
        if area is not None:
            return path
        return self.shard_path(table, shard_id, weights, staged=staged)

    def put_encoded(self, table: str, shard_id: str, weights: str, data: bytes, *, staged: bool = False) -> None:
        """Store one shard's `table` as Parquet bytes an actor encoded (`encoded`, fleet/results/packed.py):
        the same file `write` would make of its rows, whole or not at all."""
        path = self.path(table, shard_id, weights, staged=staged)
        inside(self.root, path, what=f"{table} rows of {shard_id[:200]}", local=self.local)
        put(self.fs, path, data)

    def move_in(self, ready: str) -> str:
        """Commit a file an actor wrote under READY: move it to the same place in its table. A
        rename on a file system; on an object store a server-side copy, then a delete (its bytes
        never pass through here), the object appearing whole. Returns its path in the table."""
        prefix = f"{self.root}/{READY}/"
        if not ready.startswith(prefix):
            raise ValueError(f"{ready}: not in {prefix}")
        final = f"{self.root}/{ready.removeprefix(prefix)}"
        inside(self.root, final, what=f"committed file {ready[-200:]}", local=self.local)
        with refused(final):
            if self.local:
                self.fs.create_dir(final.rsplit("/", 1)[0], recursive=True)
            self.fs.move(ready, final)
        return final

    @property
    def run_id(self) -> str:
        """run.json's run id (the directory's name if it has none), written into every row."""
        if self._run_id is None:
            self._run_id = str(self.info().get("run_id") or self.root.rstrip("/").rsplit("/", 1)[-1])
        return self._run_id

    def completed_shards(self) -> set[str]:
        """Ids of shards whose `shards` row was written: their requests and tokens are complete."""
        files = parquet_files(self.fs, f"{self.root}/shards")
        if not files:
            return set()
        import pyarrow.dataset as ds  # imports pandas: 0.2 s no report of a local run needs

        dataset = ds.dataset(files, filesystem=self.fs, format="parquet")  # files read in parallel
        return set(dataset.to_table(columns=["shard_id"]).column("shard_id").to_pylist())

    def completed_perf(self) -> set[str]:
        """Ids (model/target/scenario/level) of perf levels whose perf_levels row was written."""
        files = parquet_files(self.fs, f"{self.root}/perf_levels")
        if not files:
            return set()
        import pyarrow.dataset as ds  # imports pandas: 0.2 s no report of a local run needs

        rows = ds.dataset(files, filesystem=self.fs, format="parquet").to_table(
            columns=["model", "target", "scenario", "level"]
        )
        return {f"{r['model']}/{r['target']}/{r['scenario']}/{r['level']:05d}" for r in rows.to_pylist()}

    def completed_probes(self) -> set[str]:
        """Ids (model/target/probe-kind) of the probe calls whose table was written."""
        done: set[str] = set()
        for kind in PROBE_KINDS:
            files = parquet_files(self.fs, f"{self.root}/{kind}")
            if files:
                import pyarrow.dataset as ds  # imports pandas: 0.2 s no report of a local run needs

                rows = ds.dataset(files, filesystem=self.fs, format="parquet").to_table(columns=["model", "target"])
                done |= {f"{r['model']}/{r['target']}/probe-{kind}" for r in rows.to_pylist()}
        return done

    def info(self) -> dict[str, Any]:
        """run.json; FileNotFoundError if there is none."""
        with self.fs.open_input_stream(f"{self.root}/{RUN_JSON}") as f:
            result: dict[str, Any] = json.loads(f.read())
        return result

    def write_info(self, info: dict[str, Any]) -> None:
        """Write run.json, then the run's catalog entry: every writer of run.json (the driver at
        start, resume and end, `fleet run` recording the gate verdict) comes through here."""
        path = f"{self.root}/{RUN_JSON}"
        put(self.fs, path, json.dumps(info, indent=2, default=str).encode())
        try:
            # A stat is one system call here, one more request on an object store (not taken there).
            run_json = catalog_files.stat(self.fs.get_file_info(path)) if self.local else None
            catalog_files.record(self.fs, self.root, info, run_json)
        except OSError:  # the catalog is a cache: `fleet runs` still finds the run from its run.json
            pass

    def update_info(self, **changes: Any) -> None:
        self.write_info(self.info() | changes)

    def write_text(self, name: str, text: str) -> None:
        """A file of the run that is not a table (the drill-down's msprobe configurations), at the
        relative path `name` ("/"-separated), written whole or not at all."""
        path = "/".join([self.root, *name.split("/")])
        inside(self.root, path, what=name[:200], local=self.local)
        put(self.fs, path, text.encode())


def stamped(table: str, data: pa.Table, run_id: str) -> pa.Table:
    """`data` as stored in `table`: conformed to its declared schema, every row carrying `run_id`."""
    data = schema.conform(data, stored_tables.all_tables()[table])
    return data.set_column(0, "run_id", pa.repeat(pa.scalar(run_id, pa.string()), data.num_rows))


def stored_under(data: pa.Table) -> str:
    """The weights directory a shard's rows of one table go under: their model's, or "none" for no
    rows (an empty table has none to take them from)."""
    return str(data.column("model_weights")[0].as_py()) if data.num_rows else "none"


def encoded(data: pa.Table) -> pa.Buffer:
    """A `stamped` table as one Parquet file's bytes, with the settings every stored file has."""
    sink = pa.BufferOutputStream()
    pq.write_table(data, sink, **_options(data.schema))
    return sink.getvalue()


def _options(columns: pa.Schema) -> dict[str, Any]:
    """How a table is encoded. Dictionaries for the string columns only: on logprobs and top-k
    lists they cost time and bytes (a tokens shard: 20 % faster to write, 30 % smaller;
    docs/measurements.md). Statistics only where a filter can use them (keys, ids, positions,
    counts): a file's min and max of logprobs or of top-k list items prune nothing and cost ~4 % of the write."""
    return {
        "compression": "zstd",
        "compression_level": 1,
        "use_dictionary": _strings(columns),
        "write_statistics": _filtered(columns),
    }


def _strings(columns: pa.Schema) -> list[str]:
    return [f.name for f in columns if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)]


def _filtered(columns: pa.Schema) -> list[str]:
    """The columns a reader filters on: every one but floats and lists."""
    return [f.name for f in columns if not (pa.types.is_floating(f.type) or pa.types.is_nested(f.type))]


def _layout(table: str, shard_id: str, weights: str) -> list[str]:
    model, target, prompt_set, chunk = shard_id.split("/")
    return [table, f"model={model}", f"model_weights={weights}", f"target={target}", f"{prompt_set}-{chunk}.parquet"]
