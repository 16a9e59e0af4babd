"""mgmtd's RoutingInfo as domain types: chains, targets, tables and node addresses, and the lookups on them."""

from __future__ import annotations

from ff_fsprotocol.routing import Chain, ChainTable, NodeAddress, RoutingView, Target, TargetState
from fireflyer.common.v1 import common_pb2
from fireflyer.mgmtd.v1 import mgmtd_pb2 as mpb


def _info() -> mpb.RoutingInfo:
    return mpb.RoutingInfo(
        version=7,
        nodes=[
            mpb.Node(
                node_id=1,
                status=mpb.NODE_STATUS_ALIVE,
                enabled=True,
                endpoints=[
                    common_pb2.Endpoint(name="grpc", address="h:1"),
                    common_pb2.Endpoint(name="data", address="h:2"),
                ],
            ),
            mpb.Node(node_id=2, status=mpb.NODE_STATUS_ALIVE, enabled=False),
        ],
        chains=[
            mpb.Chain(
                chain_id=5,
                version=3,
                targets=[
                    mpb.Target(target_id=51, node_id=1, public_state=mpb.PUBLIC_TARGET_STATE_SERVING),
                    mpb.Target(target_id=52, node_id=2, public_state=mpb.PUBLIC_TARGET_STATE_SYNCING),
                    mpb.Target(target_id=53, node_id=2, public_state=mpb.PublicTargetState.ValueType(99)),
                ],
            ),
            mpb.Chain(
                chain_id=6,
                version=1,
                targets=[mpb.Target(target_id=61, node_id=1, public_state=mpb.PUBLIC_TARGET_STATE_OFFLINE)],
            ),
        ],
        chain_tables=[mpb.ChainTable(table_id=1, version=2, chain_ids=[5, 6])],
    )


def test_the_view_holds_domain_types() -> None:
    view = RoutingView(_info())
    assert view.version == 7
    assert view.chain(5) == Chain(
        5,
        3,
        (
            Target(51, 1, TargetState.SERVING),
            Target(52, 2, TargetState.SYNCING),
            Target(53, 2, TargetState.UNSPECIFIED),  # a state this release does not know serves nothing
        ),
    )
    assert view.table(1) == ChainTable(1, 2, (5, 6)) and view.table(2) is None
    assert view.node(1) == NodeAddress(1, "h:1", "h:2", True)
    assert view.node(2) == NodeAddress(2, "", "", False)  # disabled: not alive for the data path


def test_head_and_serving() -> None:
    view = RoutingView(_info())
    assert view.head(5) == Target(51, 1, TargetState.SERVING)
    assert [t.target_id for t in view.serving(5)] == [51]
    assert view.head(6) is None and view.serving(6) == []  # an offline head takes no writes
    assert view.head(9) is None and view.serving(9) == [] and view.chain(9) is None


def test_target_states_are_mgmtds() -> None:
    for name, value in mpb.PublicTargetState.items():
        assert TargetState[name.removeprefix("PUBLIC_TARGET_STATE_")] == value
