"""The main job (``make demo``, ``python -m devtools.demo``): the CDC pipeline end to end on this
machine, through Airflow.

1. Starts the local Apache Kafka broker and a MongoDB: yours when ``MONGOCDC_MONGODB_URI`` is set,
   else a ``mongod`` from PATH (a one-member replica set in a temporary directory), else the
   MongoDB simulator (``devtools/mongosim``), said so plainly.
2. Loads a small ``shop`` database (customers, products, orders).
3. Runs ``airflow dags test mongocdc_hourly``: its snapshot task copies the collections to Kafka
   (spark-submit), its window task finds nothing new yet.
4. Changes data: inserts, updates, a replace, a transaction across orders and products, deletes.
5. Runs ``airflow dags test mongocdc_hourly`` again: the snapshot task has nothing to do, the
   window streams the changes.
6. Runs ``airflow dags test mongocdc_demo_iceberg``: a DAG of the demo's own whose
   ``MongoTableApplyOperator`` applies the same topics to Apache Iceberg tables (a SQL catalog on
   SQLite in the work directory).
7. Prints the events per topic, a few sample events, the offsets (``mongocdc offsets show``), and
   checks that the state rebuilt from the topics equals the collections in MongoDB, and that the
   Delta tables the hourly DAG's ``delta_apply`` task filled (one per collection, read by delta-rs)
   and the Iceberg tables (read by pyiceberg) equal them too.

Airflow runs with a throwaway AIRFLOW_HOME (SQLite) in a temporary directory; its and Spark's
output go to a log file whose path is printed. Everything the demo starts is stopped at the end,
also on failure and Ctrl-C; the exit code is 0 only when every step worked and the check is OK.

Environment: ``MONGOCDC_MONGODB_URI`` (use your MongoDB replica set or sharded cluster),
``MONGOCDC_DEMO_DATABASE`` (database name, default ``shop``; on your MongoDB its collections
customers, products and orders must not exist yet, and the demo drops them at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import textwrap
import time
import traceback
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

from pymongo.errors import PyMongoError

from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from devtools.demo import data as sample
from devtools.demo import report
from devtools.demo.services import (
    MARKER_ENV,
    MONGODB_URI_ENV,
    REPO,
    AirflowCommand,
    DemoError,
    LocalMongod,
    MongoServer,
    airflow_environment,
    find_mongod,
    mongocdc_offsets_show,
    processes_marked,
    tail,
)
from devtools.kafka import KafkaBroker, KafkaLaunchError
from devtools.kafka.broker import JAR_DIR
from devtools.mongosim import MongoSim, MongoSimError

DATABASE_ENV = "MONGOCDC_DEMO_DATABASE"
TOPIC_PREFIX = "demo"
DAG_ID = "mongocdc_hourly"
ICEBERG_DAG_ID = "mongocdc_demo_iceberg"
STEPS = 7
# The demo's own DAG: the table apply of the connector's topics to Iceberg tables.
ICEBERG_DAG = """from airflow.sdk import DAG

from airflow_provider_mongocdc.operators.table_apply import MongoTableApplyOperator

with DAG("{dag_id}", schedule=None, catchup=False, tags=["mongocdc", "demo"]):
    MongoTableApplyOperator(
        task_id="iceberg_apply",
        tables={tables!r},
        connector_config="{{{{ var.value.mongocdc_connector_config }}}}",
        pool="{pool}",
    )
"""
MIGRATE_TIMEOUT_S = 600
DAG_TEST_TIMEOUT_S = 900
# The operators' summary lines in the task logs: "<message> [<logger of the operator>]".
SUMMARY_LINE = re.compile(
    r"\]\s+((?:Snapshot |No snapshot|Stream |Delta apply |Iceberg apply ).*?)\s+"
    r"\[airflow\.task\.operators\.airflow_provider_mongocdc\.operators\.\w+\.(\w+)\]"
)
OPERATOR_TASKS = {
    "MongoSnapshotOperator": "snapshot",
    "MongoStreamWindowOperator": "window",
    "MongoDeltaApplyOperator": "delta_apply",
    "MongoTableApplyOperator": "iceberg_apply",
}


class Interrupted(BaseException):
    """SIGTERM or SIGHUP: stop like on Ctrl-C."""


def say(text: str = "") -> None:
    print(text, flush=True)


def redact(uri: str) -> str:
    return re.sub(r"//[^@/]+@", "//***:***@", uri)


def kafka_version() -> str:
    jars = sorted(JAR_DIR.glob("kafka_2.13-*.jar"))
    return jars[0].stem.split("-", 1)[1] if jars else "?"


class Demo:
    def __init__(self, work_dir: Path, log):
        self.work_dir = work_dir
        self.log = log
        self.broker: KafkaBroker | None = None
        self.sim: MongoSim | None = None
        self.mongod: LocalMongod | None = None
        self.mongo: MongoServer | None = None
        self.database_name = os.environ.get(DATABASE_ENV) or "shop"
        self.collections_created = False
        self.airflow_commands: list[AirflowCommand] = []
        self.env: dict[str, str] = {}
        self.step_times: list[tuple[str, float]] = []
        self.check_ok = False

    # -- steps -------------------------------------------------------------------------------------
    @contextmanager
    def step(self, number: int, title: str):
        say(f"\n[{number}/{STEPS}] {title}")
        began = time.monotonic()
        yield
        elapsed = time.monotonic() - began
        self.step_times.append((title, elapsed))
        say(f"      step {number} done in {elapsed:.1f} s")

    def run(self) -> None:
        with self.step(1, "Starting Kafka, MongoDB and a throwaway Airflow home"):
            self.start_services()
        with self.step(2, f"Loading the sample data into the database {self.database_name!r}"):
            self.load_data()
        hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        # Hourly runs whose data intervals end in the future: each window ends "now".
        first, second = (hour + timedelta(hours=1)).isoformat(), (hour + timedelta(hours=2)).isoformat()
        with self.step(3, f"Snapshot through Airflow: airflow dags test {DAG_ID} {first}"):
            self.dag_test(first)
        with self.step(4, "Changing data in MongoDB"):
            self.change_data()
        with self.step(5, f"Window through Airflow: airflow dags test {DAG_ID} {second}"):
            self.dag_test(second)
        with self.step(6, f"Iceberg tables through Airflow: airflow dags test {ICEBERG_DAG_ID} {second}"):
            self.dag_test(second, ICEBERG_DAG_ID)
        with self.step(7, "Reading the topics as a consumer would"):
            self.check_ok = self.show_results()

    def start_services(self) -> None:
        home = self.work_dir / "airflow"
        home.mkdir()
        config = {
            "topic.prefix": TOPIC_PREFIX,
            "collection.include.list": ",".join(
                f"{re.escape(self.database_name)}\\.{name}" for name in sample.COLLECTIONS
            ),
            "provide.transaction.metadata": "true",
            "snapshot.max.threads": "2",
            "snapshot.chunk.size": "100",
        }
        pool = f"mongocdc_{TOPIC_PREFIX}"
        # The example connector list, with the collections kept as Delta tables under the work dir.
        self.lake = self.work_dir / "delta"
        connectors = self.work_dir / "mongocdc_connectors.json"
        entry = {
            "name": "default",
            "config_variable": "mongocdc_connector_config",
            "delta": {
                "location": str(self.lake),
                "columns": {f"{self.database_name}.orders": {"status": "string"}},
            },
        }
        connectors.write_text(json.dumps({"connectors": [entry]}))
        # The repository's DAG files, and the demo's own Iceberg DAG beside them.
        self.iceberg_lake = self.work_dir / "iceberg"
        dags = self.work_dir / "dags"
        shutil.copytree(REPO / "dags", dags)
        iceberg_tables = {
            "format": "iceberg",
            "location": str(self.iceberg_lake),
            "columns": {f"{self.database_name}.orders": {"status": "string"}},
        }
        (dags / f"{ICEBERG_DAG_ID}.py").write_text(
            ICEBERG_DAG.format(dag_id=ICEBERG_DAG_ID, tables=iceberg_tables, pool=pool)
        )
        self.env = airflow_environment(
            home,
            self.work_dir,
            {
                "MONGOCDC_CONNECTORS_FILE": str(connectors),
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                "AIRFLOW_VAR_MONGOCDC_CONNECTOR_CONFIG": json.dumps(config),
                "MONGOCDC_POOL": pool,
                "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            },
        )
        # The metadata database is created while Kafka and MongoDB start.
        migrate = self.airflow("db", "migrate")

        self.broker = KafkaBroker(self.work_dir / "kafka")
        self.broker.start()
        say(
            f"      Kafka: Apache Kafka {kafka_version()} broker (KRaft, one node) at "
            f"{self.broker.bootstrap_servers}, pid {self.broker.pid}, started in {self.broker.start_seconds:.1f} s"
        )

        self.mongo = self.start_mongodb()
        if self.mongo.kind == "simulator":
            say(
                f"      MongoDB: simulator (devtools/mongosim) — not a real mongod; set {MONGODB_URI_ENV} "
                "to use yours (or put mongod on PATH)"
            )
            say(f"               {self.mongo.description}, pid {self.mongo.pid}")
        else:
            say(
                f"      MongoDB: {self.mongo.description}"
                + (f", pid {self.mongo.pid}" if self.mongo.pid else "")
            )
        self.env["AIRFLOW_CONN_MONGOCDC_DEFAULT"] = json.dumps(
            {"conn_type": "mongocdc", "host": self.mongo.uri}
        )
        self.env["AIRFLOW_CONN_KAFKA_DEFAULT"] = json.dumps(
            {"conn_type": "mongocdc_kafka", "extra": {"bootstrap.servers": self.broker.bootstrap_servers}}
        )

        migrate.wait(MIGRATE_TIMEOUT_S)
        self.airflow("pools", "set", pool, "1", f"MongoDB CDC connector {TOPIC_PREFIX}").wait(
            MIGRATE_TIMEOUT_S
        )
        say(
            f"      Airflow: AIRFLOW_HOME={home} (SQLite, examples off, dags from {self.env['AIRFLOW__CORE__DAGS_FOLDER']}), "
            f"pool {pool} (1 slot)"
        )
        say(f"      connector configuration (Variable mongocdc_connector_config): {json.dumps(config)}")

    def start_mongodb(self) -> MongoServer:
        uri = os.environ.get(MONGODB_URI_ENV)
        if uri:
            return MongoServer("yours", uri, None, f"yours, from {MONGODB_URI_ENV} ({redact(uri)})")
        mongod = find_mongod()
        if mongod:
            self.mongod = LocalMongod(mongod, self.work_dir / "mongod")
            return self.mongod.start()
        self.sim = MongoSim(mode="replset", max_seconds=3600)
        self.sim.start()
        with self.sim.client(tz_aware=True) as client:
            version = client.server_info().get("version", "?")
        return MongoServer(
            "simulator",
            self.sim.uri,
            self.sim.pid,
            f"one-member replica set rs0 at {self.sim.uri}, reports MongoDB {version}",
        )

    def load_data(self) -> None:
        with self.mongo.client() as client:
            database = client[self.database_name]
            if self.mongo.kind == "yours":
                existing = set(database.list_collection_names()) & set(sample.COLLECTIONS)
                if existing:
                    raise DemoError(
                        f"The database {self.database_name!r} on your MongoDB already has the collections "
                        f"{sorted(existing)}; the demo does not write into existing data. Fix: set "
                        f"{DATABASE_ENV} to a database name that does not exist yet."
                    )
            self.collections_created = True
            counts = sample.load(database, sample.generate())
        say(
            "      "
            + ", ".join(f"{self.database_name}.{name}: {n} documents" for name, n in counts.items())
            + f" ({sum(counts.values())} in all)"
        )
        say(
            "      types: ObjectId and string _id, Decimal128 prices, datetimes, Int64, doubles, booleans, "
            "nulls, nested documents, arrays of documents"
        )

    def change_data(self) -> None:
        with self.mongo.client() as client:
            applied = sample.apply_changes(client, client[self.database_name])
            counts = {
                name: client[self.database_name][name].count_documents({}) for name in sample.COLLECTIONS
            }
        say(f"      {applied.describe()}")
        say("      now: " + ", ".join(f"{self.database_name}.{name}: {n}" for name, n in counts.items()))

    def airflow(self, *args: str) -> AirflowCommand:
        command = AirflowCommand(args, self.env, self.log, self.work_dir)
        self.airflow_commands.append(command)
        return command

    def dag_test(self, logical_date: str, dag_id: str = DAG_ID) -> None:
        output = self.airflow("dags", "test", dag_id, logical_date).wait(DAG_TEST_TIMEOUT_S)
        summaries = operator_summaries(output)
        for task, text in summaries:
            wrapped = textwrap.wrap(
                f"{task} task: {text}", report.WIDTH - 6, subsequent_indent="  ", break_long_words=False
            )
            for line in wrapped:
                say("      " + line)
        if not summaries:
            say("      (the tasks' summary lines were not found in the Airflow output; see the log file)")
        submitted = re.findall(r"Spark-Submit cmd: .*?--name (\S+)", output)
        say(f"      spark-submit runs: {', '.join(submitted) if submitted else 'none'}")

    def show_results(self) -> bool:
        bootstrap = self.broker.bootstrap_servers
        topics = report.demo_topics(bootstrap, TOPIC_PREFIX)
        reports = [report.read_events(bootstrap, topic) for topic in topics]

        say("\n  Events per topic (read_committed consumer; r=read c=create u=update d=delete):")
        for line in report.counts_table(reports):
            say(line)

        say("\n  Sample events (payloads; the schema part of each record is left out):")
        for title, event in report.pick_samples(reports, TOPIC_PREFIX, self.database_name):
            for line in report.render_event(event, title):
                say(line)

        say(
            f"\n  Offsets: $ mongocdc offsets show --bootstrap-servers {bootstrap} --topic-prefix {TOPIC_PREFIX}"
        )
        shown = mongocdc_offsets_show(bootstrap, TOPIC_PREFIX)
        lines = report.pretty(shown, 10, report.WIDTH - 4)
        for line in lines[:50]:
            say("    " + line)
        if len(lines) > 50:
            say(f"    … ({len(lines) - 50} more lines)")

        say(
            "\n  Check: the state rebuilt from the topics (last event per key, deletes and tombstones "
            "removing it) against MongoDB:"
        )
        by_topic = {r.topic: r for r in reports}
        results = []
        with self.mongo.client() as client:
            database = client[self.database_name]
            for collection in sample.COLLECTIONS:
                topic = f"{TOPIC_PREFIX}.{self.database_name}.{collection}"
                comparison = report.compare(
                    database, collection, by_topic.get(topic, report.TopicReport(topic))
                )
                results.append(comparison)
                say(comparison.line(topic))
        documents = sum(c.documents for c in results)
        rebuilt = sum(c.rebuilt for c in results)
        ok = all(c.ok for c in results)
        say(
            f"\n  CHECK {'OK' if ok else 'MISMATCH'}: {rebuilt} keys rebuilt from the topics, {documents} "
            f"documents in MongoDB, {sum(not c.ok for c in results)} of {len(results)} collections differ"
        )
        say(f"\n  Check: the Delta tables under {self.lake} (read by delta-rs) against MongoDB:")
        tables = []
        with self.mongo.client() as client:
            database = client[self.database_name]
            for collection in sample.COLLECTIONS:
                path = self.lake / self.database_name / collection
                if not path.exists():
                    say(f"  MISSING  {collection}: no table at {path}")
                    tables.append(None)
                    continue
                comparison = report.compare_table(database, collection, str(path))
                tables.append(comparison)
                say(comparison.line(f"the table {path}"))
        tables_ok = all(c is not None and c.ok for c in tables)
        say(
            f"\n  CHECK {'OK' if tables_ok else 'MISMATCH'}: {len(tables)} Delta tables, "
            f"{sum(c.rebuilt for c in tables if c)} rows, {documents} documents in MongoDB"
        )
        say(
            f"\n  Check: the Iceberg tables of the catalog {self.iceberg_lake / 'catalog.db'} (read by pyiceberg):"
        )
        icebergs = []
        with self.mongo.client() as client:
            database = client[self.database_name]
            for collection in sample.COLLECTIONS:
                comparison = report.compare_iceberg_table(
                    database, collection, self.iceberg_lake, self.database_name
                )
                icebergs.append(comparison)
                if comparison is None:
                    say(f"  MISSING  {collection}: no table {self.database_name}.{collection}")
                else:
                    say(comparison.line(f"the table {self.database_name}.{collection}"))
        icebergs_ok = all(c is not None and c.ok for c in icebergs)
        say(
            f"\n  CHECK {'OK' if icebergs_ok else 'MISMATCH'}: {len(icebergs)} Iceberg tables, "
            f"{sum(c.rebuilt for c in icebergs if c)} rows, {documents} documents in MongoDB"
        )
        return ok and tables_ok and icebergs_ok

    # -- stopping ------------------------------------------------------------------------------------
    def stop_all(self) -> list[str]:
        """Stop everything the demo started, each by its id; returns what was stopped."""
        stopped = []
        for command in self.airflow_commands:
            if command.stop():
                stopped.append(
                    f"airflow {command.args[0]} {command.args[1]} (pid {command.process.pid}, "
                    "with its Spark application if any)"
                )
        if self.mongo is not None and self.mongo.kind == "yours" and self.collections_created:
            names = ", ".join(f"{self.database_name}.{name}" for name in sample.COLLECTIONS)
            try:
                with self.mongo.client() as client:
                    for name in sample.COLLECTIONS:
                        client[self.database_name].drop_collection(name)
                stopped.append(f"the demo's collections dropped on your MongoDB ({names})")
            except PyMongoError as error:
                stopped.append(f"the demo's collections ({names}) NOT dropped on your MongoDB: {error}")
        if self.mongod is not None:
            pid = self.mongod.process.pid if self.mongod.process else None
            self.mongod.stop()
            stopped.append(f"mongod (pid {pid})")
        if self.sim is not None:
            pid = self.sim.pid
            self.sim.stop()
            stopped.append(f"MongoDB simulator (pid {pid})")
        if self.broker is not None:
            pid = self.broker.pid
            self.broker.stop()
            stopped.append(f"Kafka broker (pid {pid})")
        return stopped


def operator_summaries(output: str) -> list[tuple[str, str]]:
    """The summary lines the provider's operators log in ``airflow dags test`` output, without
    the positions (the offsets are shown later) and the lag figures."""
    found = []
    for line in output.splitlines():
        match = SUMMARY_LINE.search(line)
        if not match:
            continue
        text, operator = match.group(1), match.group(2)
        text = re.sub(r"; lag [^;]*", "", text.split("; position", 1)[0])
        task = OPERATOR_TASKS.get(operator, operator)
        if (task, text) not in found:
            found.append((task, text))
    return found


def _raise_interrupted(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(
        prog="python -m devtools.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    ).parse_args(argv)
    began = time.monotonic()
    work_dir = Path(tempfile.mkdtemp(prefix="mongocdc-demo-"))
    log_fd, log_name = tempfile.mkstemp(prefix="mongocdc-demo-", suffix=".log")
    log_path = Path(log_name)
    os.environ[MARKER_ENV] = str(work_dir)  # inherited by every process the demo starts
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupted)
    say(
        "mongocdc demo: MongoDB -> Airflow (snapshot and stream-window tasks on Spark) -> Debezium-style "
        "events in Kafka"
    )
    say(f"  work dir {work_dir} (removed at the end); Airflow and Spark output go to {log_path}")
    failure: str | None = None
    code = 0
    demo = None
    os.close(log_fd)
    with open(log_path, "w") as log:
        demo = Demo(work_dir, log)
        try:
            demo.run()
            if not demo.check_ok:
                failure, code = (
                    "the state rebuilt from the topics differs from MongoDB (see MISMATCH above)",
                    1,
                )
        except KeyboardInterrupt:
            failure, code = "interrupted (Ctrl-C)", 130
        except Interrupted as signal_name:
            failure, code = f"interrupted ({signal_name})", 143
        except (DemoError, MongoCdcError, KafkaLaunchError, MongoSimError, PyMongoError) as error:
            failure, code = f"{type(error).__name__}: {error}", 1
        except Exception as error:  # any other failure still stops everything and says where it was
            traceback.print_exc(file=log)
            failure, code = f"{type(error).__name__}: {error} (traceback in the log file)", 1
        finally:
            # A second Ctrl-C must not cut the stopping short.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            say("\nStopping what the demo started...")
            try:
                stopped = demo.stop_all()
            except BaseException as error:  # keep stopping the rest
                stopped = [f"(stopping failed: {error})"]
            leftovers = processes_marked(str(work_dir))
            for pid, command in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                stopped.append(f"LEFTOVER process {pid} killed: {command[:100]}")
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            say("  stopped: " + ("; ".join(stopped) if stopped else "nothing was running"))
            shutil.rmtree(work_dir, ignore_errors=True)
            say(f"  removed {work_dir}")
    total = time.monotonic() - began
    if demo is not None and demo.step_times:
        say(
            "\nTime per step: "
            + ", ".join(f"{n}. {t:.0f} s" for n, (_, t) in enumerate(demo.step_times, 1))
            + f"; total {total:.0f} s"
        )
    if failure is None:
        say(
            f"\nDemo finished: the pipeline works end to end (total {total:.0f} s). "
            f"Airflow's and Spark's output: {log_path}"
        )
        return 0
    print(f"\nDemo FAILED: {failure}", file=sys.stderr)
    if code in (130, 143):
        print(f"Airflow's and Spark's output so far: {log_path}", file=sys.stderr)
    else:
        print(
            f"Airflow's and Spark's output: {log_path}; its last lines:\n{tail(log_path, 40)}",
            file=sys.stderr,
        )
    return code
