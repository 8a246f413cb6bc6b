"""Numbers from a foreign file or a server are bounded before anything is allocated, and the
remote policy client is bounded like the server (issue 42, items 3 and 4).

A LeRobot policy folder's chunking is checked (and the ``lerobot`` environment looked up)
before a probe is drawn; a policy server's metadata is read under a small cap and its numbers
checked before they size anything; every answer is read under a cap derived from the answer
owed, and whatever a server answers (raw bytes, wrong types, an object array, NaN, a huge
array, a wrong shape) is a failed call or one short line, never a traceback. The servers here
are real websocket servers on loopback that send what they are told, with no cap of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.server import serve

from physai_core.errors import ConfigError
from stages.policies import policy_server, remote, wire
from stages.policies.lerobot import export_policy, read_folder
from stages.sim.tasks.catalog import get_task
from stages.training.import_sources import Where
from stages.training.imported import ImportConfig, import_policy
from tests.stages.test_lerobot_policy import write_folder
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]
FILE, FIELD = "pipeline.yaml", "train.source"
OBS_DIM, ACT_DIM = 23, 7
"""reach-v0's widths: the task the CLI door validates on."""
MAX_LINE = 400
"""Longest refusal line accepted: the URI, the reason cut to wire.REASON_CHARS, what was sent."""


def reach_folder(folder: Path, **changes: Any) -> Path:
    """A LeRobot ACT policy folder for reach-v0 (the state alone), ``changes`` in config.json."""
    return write_folder(folder, **{
        "input_features": {"observation.state": {"type": "STATE", "shape": [OBS_DIM]}},
        "output_features": {"action": {"type": "ACTION", "shape": [ACT_DIM]}}, **changes})


# --- A LeRobot policy folder -------------------------------------------------------------------

PEAK = """
def peak():
    # VmHWM, this process's own peak resident memory (KiB); ru_maxrss would start at the
    # parent's peak, kept across exec
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
"""
PEAK_SCRIPT = PEAK + """
import json, sys
from pathlib import Path
from physai_core.errors import PhysaiError
from stages.training.import_sources import Where
from stages.training.imported import ImportConfig, import_policy
from stages.sim.tasks.catalog import get_task
spec = get_task("reach-v0")
before = peak()
try:
    import_policy(ImportConfig(source=sys.argv[1]), spec, base=Path.cwd(),
                  where=Where("pipeline.yaml", "train.source"))
    error = None
except PhysaiError as exc:
    error = [type(exc).__name__, str(exc)]
grown = peak() - before
print(json.dumps({"error": error, "grown_kib": grown}))
"""


def test_a_chunk_size_of_500000_is_one_line_before_anything_is_allocated(tmp_path: Path) -> None:
    """The issue's case: chunk_size 500000 drew about 526 MiB of probes before the missing
    environment was noticed. Measured in a fresh process: its peak memory over the import."""
    folder = reach_folder(tmp_path / "p", chunk_size=500_000, n_action_steps=500_000)
    env = {**os.environ, "PHYSAI_ENV_LEROBOT_PYTHON": str(tmp_path / "no-python")}
    done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, str(folder)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    kind, line = result["error"]
    assert kind == "ConfigError" and "\n" not in line, result
    assert line.startswith(f"{FILE}: {FIELD}: config.json of the LeRobot policy must give "
                           "chunk_size as a whole number 1 .. 1,024"), line
    assert line.endswith("(value: 'chunk_size 500000')"), line
    assert result["grown_kib"] < 32 * 1024, result


def test_the_environment_is_looked_up_before_any_probe_is_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stages.core.environments import EnvironmentMissingError

    spec = get_task("reach-v0")
    folder = read_folder(reach_folder(tmp_path / "p", chunk_size=1024, n_action_steps=1024),
                         spec, FILE, FIELD)
    monkeypatch.setenv("PHYSAI_ENV_LEROBOT_PYTHON", str(tmp_path / "no-python"))
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(EnvironmentMissingError, match="make lerobot"):
        export_policy(folder, spec.obs_dim, spec.act_dim, work=work, file=FILE, field=FIELD)
    assert list(work.iterdir()) == []  # no probes.npz: nothing was drawn


@pytest.mark.parametrize(("changes", "value", "says"), [
    ({"chunk_size": 0}, "chunk_size 0", "chunk_size as a whole number 1 .. 1,024"),
    ({"chunk_size": 2**40}, "chunk_size 1099511627776", "1 .. 1,024"),
    ({"chunk_size": 10.5}, "chunk_size 10.5", "chunk_size as a whole number"),
    ({"chunk_size": True}, "chunk_size True", "chunk_size as a whole number"),
    ({"chunk_size": "10"}, "chunk_size '10'", "chunk_size as a whole number"),
    ({"n_action_steps": 11}, "n_action_steps 11", "n_action_steps as a whole number 1 .. 10"),
    ({"n_action_steps": None}, "n_action_steps None", "n_action_steps as a whole number"),
    ({"temporal_ensemble_coeff": float("nan")}, "temporal_ensemble_coeff nan", "finite"),
    ({"temporal_ensemble_coeff": -1}, "temporal_ensemble_coeff -1", "finite number >= 0"),
    ({"temporal_ensemble_coeff": "0.01"}, "temporal_ensemble_coeff '0.01'", "null or a"),
    ({"output_features": {"action": {"type": "ACTION", "shape": ["x"]}}}, "action []",
     "task reach-v0's 7"),
    ({"output_features": {"action": {"type": "ACTION", "shape": [2**40]}}},
     "action [1099511627776]", "task reach-v0's 7"),
    ({"input_features": {"observation.state": {"type": "STATE", "shape": [1e400]}}},
     "observation.state []", "task reach-v0's 23"),
])
def test_every_number_of_config_json_is_bounded_in_one_line(
    tmp_path: Path, changes: dict[str, Any], value: str, says: str
) -> None:
    folder = reach_folder(tmp_path / "p", **changes)
    with pytest.raises(ConfigError) as info:
        read_folder(folder, get_task("reach-v0"), FILE, FIELD)
    line = str(info.value)
    assert "\n" not in line and line.startswith(f"{FILE}: {FIELD}: "), line
    assert f"(value: {value!r})" in line and says in line, line


def test_probes_over_their_limit_and_an_oversized_config_are_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stages.policies import lerobot as lerobot_policy
    spec = get_task("reach-vision-v0")  # a 64 x 64 camera: 2,049 steps of 2 worlds, 51 MB
    folder = write_folder(tmp_path / "p", chunk_size=1024, n_action_steps=1)
    assert read_folder(folder, spec, FILE, FIELD).chunk_size == 1024
    monkeypatch.setattr(lerobot_policy, "MAX_PROBE_BYTES", 2**25)
    with pytest.raises(ConfigError, match=r"need 48\.8 MiB of probe observations to check "
                       r"parity, over the 32\.0 MiB allowed .*\(value: 'chunk_size 1024'\)"):
        read_folder(folder, spec, FILE, FIELD)
    big = folder / "config.json"
    big.write_text(big.read_text() + " " * (16 * 2**20))
    with pytest.raises(ConfigError, match=r"config\.json of the LeRobot policy is 16\.0 MiB, "
                       r"over the 16\.0 MiB read"):
        read_folder(folder, spec, FILE, FIELD)


def test_the_import_refuses_the_chunking_before_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reach_folder(tmp_path / "p", chunk_size=2**40)
    monkeypatch.setenv("PHYSAI_ENV_LEROBOT_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(ConfigError, match=r"chunk_size as a whole number 1 \.\. 1,024"):
        import_policy(ImportConfig(source="p"), get_task("reach-v0"), base=tmp_path,
                      where=Where(FILE, FIELD))


# --- A policy server's metadata and answers ---------------------------------------------------

class Hostile:
    """A websocket server on loopback that sends ``hello`` on connecting and ``answer`` to every
    frame (a list: the next of them, over all connections), with no frame cap of its own;
    ``closes`` records the close code each client sent when it hung up on an answer."""

    def __init__(self, hello: bytes | str, answer: bytes | str | list[bytes] = b"") -> None:
        self.hello = hello
        self.answers = answer if isinstance(answer, list) else None
        self.answer = answer if not isinstance(answer, list) else b""
        self.closes: list[int | None] = []
        self.port = free_port()
        self.uri = f"ws://127.0.0.1:{self.port}"
        self.server = serve(self.handle, "127.0.0.1", self.port, compression=None,
                            max_size=None)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, conn: Any) -> None:
        try:
            conn.send(self.hello)
            for _ in conn:
                conn.send(self.answers.pop(0) if self.answers else self.answer)
        except ConnectionClosed as exc:
            self.closes.append(exc.rcvd.code if exc.rcvd is not None else None)


    def closed(self, timeout: float = 60.0) -> list[int | None]:
        """:attr:`closes`, once a client's close has reached the handler (its send of a large
        answer may still be under way when the client has already hung up), or as it is after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not self.closes and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.closes


@pytest.fixture
def hostile() -> Iterator[Callable[..., Hostile]]:
    servers: list[Hostile] = []

    def start(hello: bytes | str, answer: bytes | str | list[bytes] = b"") -> Hostile:
        servers.append(Hostile(hello, answer))
        return servers[-1]

    yield start
    for server in servers:
        server.server.shutdown()


def meta(**extra: Any) -> bytes:
    """The metadata of a server of reach-v0 that takes batches, with ``extra``."""
    return wire.packb({"task": "reach-v0", "obs_dim": OBS_DIM, "act_dim": ACT_DIM,
                         "policy_digest": "hostile", **extra})


def refused_at_connect(server: Hostile) -> str:
    with pytest.raises(remote.RemotePolicyError) as info:
        remote.RemotePolicy(server.uri, OBS_DIM, ACT_DIM, timeout_s=5)
    line = str(info.value)
    assert "\n" not in line and len(line) <= MAX_LINE, line
    assert line.startswith(f"remote policy {server.uri}: "), line
    return line


@pytest.mark.parametrize(("hello", "says"), [
    (meta(chunk_size=2**40), "the metadata's chunk_size is 1099511627776, not a whole number "
                             "1 .. 1,024"),
    (meta(chunk_size="50"), "the metadata's chunk_size is '50', not a whole number"),
    (meta(chunk_size=0), "the metadata's chunk_size is 0"),
    (meta(max_batch=-1), "the metadata's max_batch is -1, not a whole number from 1"),
    (meta(act_dim=[7]), "the metadata's act_dim is [7]"),
    (meta(image_shapes={"observation/image": [2**40, 64, 3]}),
     "image_shapes['observation/image'] is [1099511627776, 64, 3], not three sides 1 .. 4,096"),
    (meta(image_shapes={"observation/image": "64x64"}), "not three sides"),
    (meta(image_shapes=[64, 64, 3]), "the metadata's image_shapes is [64, 64, 3], not a map"),
    (meta(keys={"obs": ["observation/state"]}), "not a map of names to names"),
    (meta(keys={"obs": "o" * 300_000}), "keys is {'obs': 'oooooooooooooooooooooooooooo..., not "
                                        "a map of names to names (texts of at most 200"),
    (meta(image_shapes={"i" * 300_000: [64, 64, 3]}), "image_shapes['iiiiiiiiiiiiiiiiiiiiiiii"),
    (meta(task="x" * 100_000), "xxxxxxxxxx..., not a text of at most 200 characters"),
    (wire.packb([1, 2, 3]), "the metadata is a list, not a map"),
    (os.urandom(4096), "the metadata frame is not a msgpack message of the protocol"),
    (msgpack.packb({"pad": b"\0" * (2 << 20)}), "the metadata frame is over the cap of "
                                                 "1,048,576 bytes; refused unread"),
], ids=lambda v: v[:60] if isinstance(v, str) else "frame")
def test_metadata_numbers_are_bounded_before_they_size_anything(
    hostile: Callable[..., Hostile], hello: bytes, says: str
) -> None:
    assert says in refused_at_connect(hostile(hello))


def first_call(server: Hostile, sent: str = "obs float32 (2, 23)") -> str:
    """The one-line refusal of the first call to ``server``, which was ``sent`` that."""
    client = remote.RemotePolicy(server.uri, OBS_DIM, ACT_DIM, timeout_s=5)
    try:
        with pytest.raises(remote.RemotePolicyError) as info:
            client(np.zeros((2, OBS_DIM), np.float32))
    finally:
        client.close()
    line = str(info.value)
    assert "\n" not in line and len(line) <= MAX_LINE, line
    assert line.startswith(f"remote policy {server.uri}: the first call failed ("), line
    assert line.endswith(f"it sent {sent}"), line
    return line


CLIENT_SCRIPT = PEAK + """
import json, sys
import msgpack, numpy as np, websockets.sync.client
from stages.policies import remote
before = peak()
try:
    client = remote.RemotePolicy(sys.argv[1], 23, 7, timeout_s=30)
    client(np.zeros((2, 23), np.float32))
    error = None
except remote.RemotePolicyError as exc:
    error = str(exc)
grown = peak() - before
print(json.dumps({"error": error, "grown_kib": grown}))
"""


def test_a_100_mib_answer_is_refused_unread(hostile: Callable[..., Hostile]) -> None:
    """The issue's case: the client read and decoded a 100 MiB answer. Measured in a client
    process of its own: its peak memory over connecting and the first call."""
    huge = wire.packb({"actions": np.zeros(25 * 2**20, np.float32)})
    assert len(huge) > 100 * 2**20
    server = hostile(meta(chunk_size=4), huge)
    cap = 4096 * 4 * ACT_DIM * 16 + wire.FRAME_OVERHEAD_BYTES
    line = first_call(server)
    assert f"(malformed answer: a frame over the cap of {cap:,} bytes (the actions of 4096 " \
           "observations); refused unread)" in line, line
    assert server.closed() == [1009]  # websockets' own max_size closed it: message too big
    done = subprocess.run([sys.executable, "-c", CLIENT_SCRIPT, server.uri], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "a frame over the cap" in result["error"] and result["grown_kib"] < 16 * 1024, result


def test_the_answer_cap_holds_from_the_first_answer(hostile: Callable[..., Hostile]) -> None:
    """A server of one observation a message and chunks of 4: the first answer is held to
    4 x 7 values, not the metadata frame's 1 MiB."""
    answer = wire.packb({"actions": np.zeros((500, 4, ACT_DIM), np.float64)})  # 109 KiB
    server = hostile(wire.packb({"chunk_size": 4}), answer)
    client = remote.RemotePolicy(server.uri, OBS_DIM, ACT_DIM, timeout_s=5)
    assert client.answer_cap == 4 * ACT_DIM * 16 + wire.FRAME_OVERHEAD_BYTES < len(answer)
    client.close()
    assert f"a frame over the cap of {client.answer_cap:,} bytes (the actions of 1 " \
           "observations)" in first_call(server, sent="obs float32 (23,)")


@pytest.mark.parametrize(("answer", "says"), [
    (os.urandom(2**20), "malformed answer: a frame over the cap of 524,288 bytes"),
    (os.urandom(100_000), "(malformed answer (ValueError: not a msgpack message of the "
                          "protocol: "),
    (wire.packb({"actions": os.urandom(100_000)}), "(malformed answer (ValueError: could "
                                                     "not convert string to float: "),
    ("Traceback (most recent call last):\n" + "x" * 100_000, "(server error: xxxxxxxxxx"),
    (wire.packb([1.0] * 7), "(malformed answer (ValueError: a list without actions"),
    (wire.packb({"actions": "seven"}), "could not convert string to float: 'seven'"),
    (wire.packb({"actions": {"a": 1}}), "(malformed answer (TypeError: float() argument"),
    (msgpack.packb({"actions": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "<f4",
                                b"shape": [2**40]}}), "buffer is too small"),
    (msgpack.packb({"actions": {b"__ndarray__": True, b"dtype": "<f4", b"shape": [7]}}),
     "(malformed answer (ValueError: not a msgpack message of the protocol: KeyError: "),
    (msgpack.packb({"actions": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": "x9",
                                b"shape": [1]}}), "data type 'x9' not understood"),
    (msgpack.packb({"actions": [[[[[[[[[[]]]]]]]]]] * 3}), "actions of shape (3, 1, 1, 1, 1, "),
    (wire.packb({"actions": np.zeros((2, ACT_DIM + 1), np.float32)}),
     "malformed answer: actions of shape (2, 8), not (2, 7)"),
], ids=lambda v: v[:60] if isinstance(v, str) and "\n" not in v else "frame")
def test_no_answer_is_a_traceback_and_every_reason_is_one_short_line(
    hostile: Callable[..., Hostile], answer: bytes | str, says: str
) -> None:
    line = first_call(hostile(meta(), answer))
    assert says in line, line


def test_an_object_array_is_refused_not_read_as_pointers(tmp_path: Path) -> None:
    """An ndarray map of dtype object would make numpy read the frame's bytes as object
    pointers: dereferencing them crashes the client (and a server that reads such an
    observation). Run in a process of its own, where a crash is an exit status."""
    frame = msgpack.packb({"actions": {b"__ndarray__": True, b"data": b"\x41" * 64,
                                       b"dtype": "|O", b"shape": [8]}})
    (tmp_path / "frame.bin").write_bytes(frame)
    script = ("import sys, numpy as np\nfrom stages.policies import wire\n"
              "frame = open(sys.argv[1], 'rb').read()\n"
              "try:\n    print(np.asarray(wire.unpackb(frame)['actions'], np.float32))\n"
              "except ValueError as exc:\n    print('refused:', exc)\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "frame.bin")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (done.returncode, done.stderr[-500:])
    assert done.stdout.strip() == ("refused: not a msgpack message of the protocol: ValueError: "
                                   "an array of dtype object; only bool, integer and float "
                                   "arrays are read")


def test_a_later_oversize_answer_fails_its_call_and_the_next_is_answered(
    hostile: Callable[..., Hostile]
) -> None:
    good = wire.packb({"actions": np.ones((2, ACT_DIM), np.float32)})
    huge = wire.packb({"actions": np.zeros(2**20, np.float32)})
    server = hostile(meta(max_batch=2), [good, huge, good])
    client = remote.RemotePolicy(server.uri, OBS_DIM, ACT_DIM, timeout_s=5)
    obs = np.zeros((2, OBS_DIM), np.float32)
    assert np.array_equal(client(obs), np.ones((2, ACT_DIM), np.float32))
    assert client.answer_cap == 2 * ACT_DIM * 16 + wire.FRAME_OVERHEAD_BYTES
    assert np.array_equal(client(obs), np.zeros((2, ACT_DIM), np.float32))
    reason = ("remote policy: malformed answer: a frame over the cap of 65,760 bytes (the "
              "actions of 2 observations); refused unread")
    assert client.failures == {0: reason, 1: reason}
    assert np.array_equal(client(obs), np.ones((2, ACT_DIM), np.float32))  # connected again
    client.close()
    assert server.closed() == [1009]


def test_nan_fails_the_call_and_the_run_goes_on(hostile: Callable[..., Hostile]) -> None:
    server = hostile(meta(), wire.packb({"actions": np.full((2, ACT_DIM), np.nan,
                                                              np.float32)}))
    client = remote.RemotePolicy(server.uri, OBS_DIM, ACT_DIM, timeout_s=5)
    actions = client(np.zeros((2, OBS_DIM), np.float32))
    client.close()
    assert np.array_equal(actions, np.zeros((2, ACT_DIM), np.float32))
    assert client.failures == {0: "remote policy: malformed answer: actions that are not "
                                  "finite", 1: "remote policy: malformed answer: actions "
                                               "that are not finite"}


# --- Through the CLI door ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("suite") / "one.yaml"
    path.write_text(f"name: one\ntask: reach-v0\nscenes:\n  - {{scene: "
                    f"{ROOT / 'sim_scenes' / 'reach' / 'nominal.yaml'}, episodes: 2, "
                    f"seed: 1}}\n")
    return path


@pytest.mark.parametrize(("hello", "answer", "says"), [
    (meta(chunk_size=2**40), b"", "the metadata's chunk_size is 1099511627776, not a whole "
                                  "number 1 .. 1,024"),
    (meta(), wire.packb({"actions": np.zeros(25 * 2**20, np.float32)}),
     "the first call failed (malformed answer: a frame over the cap of 524,288 bytes"),
    (meta(), os.urandom(2**19), "the first call failed (malformed answer (ValueError: not a "
                                "msgpack message of the protocol: "),
], ids=["chunk_size 2**40", "a 100 MiB answer", "512 KiB of raw bytes"])
def test_flows_validate_refuses_a_hostile_server_in_one_line(
    hostile: Callable[..., Hostile], suite: Path, tmp_path: Path, hello: bytes, answer: bytes,
    says: str,
) -> None:
    server = hostile(hello, answer)
    env = {**os.environ, "PHYSAI_HOME": str(tmp_path / ".physai"), "MUJOCO_GL": "egl"}
    done = subprocess.run([sys.executable, "-m", "flows.cli", "validate", server.uri,
                           "--suite", str(suite), "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert len(line) <= MAX_LINE + 20 and "Traceback" not in done.stderr, line
    assert f"remote policy {server.uri}: {says}" in line, line


def test_the_server_answers_an_object_array_observation_in_one_line_and_keeps_serving() -> None:
    """The server decodes observations with the same reader: an object array is a one-line
    error frame, not a crash of the serving process."""
    from websockets.sync.client import connect

    def act(obs: np.ndarray) -> np.ndarray:
        return obs[:, :ACT_DIM]

    ready, stop, port = threading.Event(), threading.Event(), free_port()
    thread = threading.Thread(target=policy_server.serve, args=(act, {"obs_dim": OBS_DIM, "act_dim":
                                                               ACT_DIM}, "127.0.0.1", port),
                              kwargs={"ready": ready, "stop": stop}, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        with connect(f"ws://127.0.0.1:{port}") as conn:
            conn.recv(timeout=5)
            conn.send(msgpack.packb({"obs": {b"__ndarray__": True, b"data": b"\x41" * 184,
                                             b"dtype": "|O", b"shape": [OBS_DIM]}}))
            assert conn.recv(timeout=5) == (
                "bad observation: not a msgpack message of the protocol: ValueError: an array "
                "of dtype object; only bool, integer and float arrays are read")
            conn.send(wire.packb({"obs": np.ones(OBS_DIM, np.float32)}))
            frame = conn.recv(timeout=5)
            assert isinstance(frame, bytes)
            answer = wire.unpackb(frame)
            assert np.array_equal(answer["actions"], np.ones(ACT_DIM, np.float32))
    finally:
        stop.set()
        thread.join(timeout=10)
