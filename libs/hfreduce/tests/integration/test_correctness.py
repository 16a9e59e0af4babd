"""Every collective, dtype and awkward size against a float64 reference, on real processes."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Launch

SIZES = "0,1,7,1027,40000"  # empty, one, odd, not a chunk multiple (1024), several shm segments (16384)


def assert_all_correct(results: list[dict[str, Any]], world: int) -> list[dict[str, Any]]:
    assert len(results) == world
    for res in results:
        assert "cases" in res, res
        bad = [c for c in res["cases"] if not c["ok"] or c.get("counters_ok") is False]
        assert not bad, (res["rank"], bad[:3])
    names = [c["name"].replace("reduce-untouched", "reduce") for c in results[0]["cases"]]
    for res in results[1:]:
        assert [c["name"].replace("reduce-untouched", "reduce") for c in res["cases"]] == names
    for i, name in enumerate(names):
        if name.startswith(("allreduce", "broadcast", "allgather", "registered")):
            crcs = {res["cases"][i]["crc"] for res in results}
            assert len(crcs) == 1, f"{name}: ranks disagree bit-wise"
    assert len({res["seq"] for res in results}) == 1
    return results


@pytest.mark.parametrize(("nodes", "local"), [(1, 1), (1, 4), (2, 1), (2, 2), (3, 2), (4, 1)])
def test_every_op_numpy_fp32_fp16_with_registered_buffers(launch: Launch, nodes: int, local: int) -> None:
    results = launch(nodes, local, "correctness", env={"TEST_SIZES": SIZES, "TEST_REGISTERED": "1"})
    results = assert_all_correct(results, nodes * local)
    counted = [c for c in results[0]["cases"] if "counters_ok" in c]
    assert len(counted) >= 10  # the byte model was checked on copy and registered paths
    names = {c["name"] for c in results[0]["cases"]}  # all-gathers in registered buffers, exact (check's bound 0)
    assert {f"registered/allgather-{into}/float16/1027" for into in ("in-place", "out")} <= names
    assert {f"reduce_scatter_registered/avg-{into}/float32/1027" for into in ("in-place", "out")} <= names
    status = results[0]["status"]
    assert [s["rank"] for s in status] == list(range(nodes * local))
    assert {s["seq"] for s in status} == {results[0]["seq"]}
    # ordinary buffers of local ranks go through each other's memory directly (process_vm_readv/writev)
    assert {res["cross_memory"] for res in results} == {local > 1}
    assert_tree_links_one_way(results)


@pytest.mark.parametrize("pipeline", ["threads", "loop"])
@pytest.mark.parametrize(("nodes", "local"), [(2, 2), (3, 1)])
def test_every_op_on_each_pipeline_runner(launch: Launch, nodes: int, local: int, pipeline: str) -> None:
    """Both runners explicitly, whichever ``auto`` picks on this machine: a thread per tree and direction,
    or every task of the rank on one event loop (tree and ring collectives alike)."""
    env = {"TEST_SIZES": SIZES, "TEST_REGISTERED": "1", "FF_HFREDUCE_PIPELINE": pipeline}
    results = assert_all_correct(launch(nodes, local, "correctness", env=env), nodes * local)
    assert {res["pipeline"] for res in results} == {pipeline}
    assert_tree_links_one_way(results)


def assert_tree_links_one_way(results: list[dict[str, Any]]) -> None:
    """Partial chunks go up and final chunks come down on separate sockets: every rank has, per tree and tree
    neighbour, one link each way, and each carried data one way only (the other way at most the hello its
    connecting side sends, and the SYN, which the kernel counts in bytes acknowledged)."""
    for res in results:
        traffic = res["tree_links"]
        expect = set()
        for tree, node in enumerate(traffic["nodes"]):
            neighbours = [nb for nb in (node["parent"], *node["children"]) if nb >= 0]
            expect |= {(tree, d, nb) for nb in neighbours for d in ("up", "down")}
        links = traffic["links"]
        assert sorted((link["tree"], link["direction"], link["neighbour"]) for link in links) == sorted(expect)
        handshake = traffic["hello_bytes"] + 1
        for link in links:
            to_parent = link["neighbour"] == traffic["nodes"][link["tree"]]["parent"]
            outgoing = to_parent == (link["direction"] == "up")  # partials to the parent, final chunks to children
            sent, received = (link["sent"], link["received"]) if outgoing else (link["received"], link["sent"])
            assert sent > handshake and received <= handshake, (res["rank"], link)


@pytest.mark.parametrize(("nodes", "local"), [(2, 2), (3, 2)])
def test_registered_buffers_with_chunks_of_many_blocks(launch: Launch, nodes: int, local: int) -> None:
    """The library's own chunk size: each tree root reduces a chunk in several cache-sized blocks (the
    local ranks, the children, the AVG division and the copies to the other ranks, block by block)."""
    env = {
        "TEST_SIZES": "300001",
        "TEST_REGISTERED": "1",
        "TEST_DTYPES": "float32",
        "FF_HFREDUCE_CHUNK_SIZE_BYTES": str(4 << 20),
        "FF_HFREDUCE_SHM_SLOT_BYTES": str(8 << 20),
    }
    results = assert_all_correct(launch(nodes, local, "correctness", env=env), nodes * local)
    assert {c["name"] for c in results[0]["cases"]} >= {f"registered/{op}/float32/300001" for op in ("sum", "avg")}


@pytest.mark.parametrize("pipeline", ["loop", "threads"])
def test_leaves_reduce_and_send_chunks_in_pieces(launch: Launch, pipeline: str) -> None:
    """Chunks of 163840 elements (640 KiB): at 700001 elements, each leaf reduces and sends a chunk in pieces of
    131072 and 32768, then a last chunk of about 11160; ordinary buffers (read across processes) and registered
    ones, on both runners. At 2 nodes every rank is a leaf of one tree."""
    env = {
        "TEST_SIZES": "700001",
        "TEST_REGISTERED": "1",
        "TEST_DTYPES": "float32",
        "FF_HFREDUCE_PIPELINE": pipeline,
        "FF_HFREDUCE_CHUNK_SIZE_BYTES": str(640 << 10),
        "FF_HFREDUCE_SHM_SLOT_BYTES": str(4 << 20),
    }
    results = assert_all_correct(launch(2, 2, "correctness", env=env), 4)
    assert {res["cross_memory"] for res in results} == {True}
    assert {res["pipeline"] for res in results} == {pipeline}
    assert all("up_reduce_send" in res["counters"]["seconds"] for res in results)
    names = {c["name"] for c in results[0]["cases"]}
    assert names >= {f"{path}/{op}/float32/700001" for path in ("allreduce", "registered") for op in ("sum", "avg")}


@pytest.mark.parametrize(("nodes", "local"), [(1, 3), (2, 2)])
def test_ordinary_buffers_staged_through_shared_memory(launch: Launch, nodes: int, local: int) -> None:
    """The path taken when local ranks may not access each other's memory (or cross_memory=False)."""
    env = {"TEST_SIZES": SIZES, "FF_HFREDUCE_CROSS_MEMORY": "0", "TEST_DTYPES": "float32"}
    results = assert_all_correct(launch(nodes, local, "correctness", env=env), nodes * local)
    assert {res["cross_memory"] for res in results} == {False}
    assert [c for c in results[0]["cases"] if "counters_ok" in c]


def test_torch_tensors_all_dtypes_including_bf16(launch: Launch) -> None:
    results = launch(
        2,
        2,
        "correctness",
        env={"TEST_SIZES": "0,1,7,1027", "TEST_TORCH": "1", "TEST_DTYPES": "float32,float16,bfloat16"},
    )
    results = assert_all_correct(results, 4)
    assert any("bfloat16" in c["name"] for c in results[0]["cases"])


def test_flat_ring_algorithm(launch: Launch) -> None:
    results = launch(2, 2, "correctness", env={"TEST_SIZES": "0,1,7,1027,40000", "FF_HFREDUCE_ALGORITHM": "ring"})
    assert_all_correct(results, 4)


@pytest.mark.parametrize("wire", ["bf16", "fp16"])
def test_compression_error_stays_within_the_wire_rounding_bound(launch: Launch, wire: str) -> None:
    results = launch(2, 2, "compression", env={"FF_HFREDUCE_COMPRESSION": wire})
    cases = [res["cases"][0] for res in results]
    assert all(c["ok"] for c in cases), cases
    assert len({c["crc"] for c in cases}) == 1  # every rank holds the same rounded result
    # the wire rounding shows: far above fp32 rounding, within a few wire ulps
    assert all(2.0**-20 < c["max_rel_err"] <= c["bound"] for c in cases), cases


def test_zone_aware_layout(launch: Launch) -> None:
    zones = ["east", "west", "east", "west"]  # interleaved labels: nodes are regrouped zone by zone
    results = launch(
        4, 1, "correctness", env={"TEST_SIZES": "0,1,7,1027"}, node_env=lambda node: {"FF_HFREDUCE_ZONE": zones[node]}
    )
    assert_all_correct(results, 4)
    assert_tree_links_one_way(results)  # the zones' trees are chained
