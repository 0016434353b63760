"""`fast_init` (core/frozen.py): the replaced constructor builds what the dataclass's own
`__init__` builds (fields, defaults, default factories, equality, hash), the instance stays
frozen, and a class whose `__init__` it could not reproduce is refused."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Mapping

import pytest

from prfaas.core.frozen import fast_init
from prfaas.core.types import InstanceLoad, RequestInfo, Route, RouteDecision, RouteQuery


def _twin(cls: type) -> type:
    """The same fields as `cls` with the dataclass's generated `__init__`."""
    fields = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(f"{cls.__name__}Twin", [
        (name, tp, dataclasses.field(default=f.default, default_factory=f.default_factory))
        for name, tp, f in fields], frozen=True, slots=True)


@pytest.mark.parametrize(("cls", "args", "kwargs"), [
    (InstanceLoad, ("p0", "pd", "prefill"), {}),
    (InstanceLoad, ("d0", "pd", "decode", 3, 0.5, 2, 7), {}),
    (RequestInfo, ("r", 10, 4, 1.5), {"block_hashes": (1, 2)}),
    (RouteQuery, (RequestInfo("r", 10, 4, 1.5),), {}),
    (RouteQuery, (RequestInfo("r", 10, 4, 1.5), {"p0": 3}), {}),
    (RouteDecision, (Route.PD, "p0", "d0", 0, 10), {"threshold_tokens": 5, "reason": "x"}),
])
def test_fast_init_builds_what_the_dataclass_builds(cls: type, args: tuple[object, ...],
                                                    kwargs: dict[str, object]) -> None:
    fast, ref = cls(*args, **kwargs), _twin(cls)(*args, **kwargs)
    assert dataclasses.astuple(fast) == dataclasses.astuple(ref)
    assert fast == cls(*args, **kwargs)
    try:
        hash(ref)
    except TypeError:  # a field holds a dict (RouteQuery): unhashable either way
        with pytest.raises(TypeError):
            hash(fast)
    else:
        assert hash(fast) == hash(cls(*args, **kwargs))
    assert pickle.loads(pickle.dumps(fast)) == fast
    name = dataclasses.fields(cls)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(fast, name, "other")


def test_default_factory_gives_each_instance_its_own() -> None:
    a, b = RouteQuery(RequestInfo("a", 1, 1, 0.0)), RouteQuery(RequestInfo("b", 1, 1, 0.0))
    assert isinstance(a.cached_tokens, Mapping) and a.cached_tokens == {}
    assert a.cached_tokens is not b.cached_tokens


def test_missing_argument_is_refused_as_before() -> None:
    with pytest.raises(TypeError):
        InstanceLoad("p0", "pd")  # type: ignore[call-arg]


def test_classes_it_cannot_reproduce_are_refused() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Post:
        x: int

        def __post_init__(self) -> None: ...

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class KwOnly:
        x: int

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        x: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        x: int

    for cls in (Post, KwOnly, NoSlots, NotFrozen):
        with pytest.raises(TypeError):
            fast_init(cls)
