"""`Enumeration`: cases, messages, equality, inheritance and `promote`,
`where`, `error_if`, and cases passing through the transforms."""

from __future__ import annotations

import io
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import filterax as fx


class Results(fx.Enumeration):
    success = ""
    diverged = "the iteration diverged"


class MoreResults(Results):
    cancelled = "cancelled by the user"


def test_cases_are_looked_up_with_their_messages():
    assert len(Results) == 2 and len(MoreResults) == 3
    assert Results[Results.diverged] == "the iteration diverged"
    assert list(Results) == [Results.success, Results.diverged]
    assert repr(Results.diverged) == f"{__name__}.Results<the iteration diverged>"
    assert fx.tree_pformat({"r": Results.success}) == f"{{'r': {__name__}.Results<>}}"
    assert isinstance(Results.success, Results)
    assert not isinstance(Results.success, MoreResults)
    assert isinstance(MoreResults.success, fx.Enumeration)


def test_equality_is_a_concrete_boolean_array_when_both_cases_are_known():
    same = Results.success == Results.success
    assert isinstance(same, jax.Array) and bool(same)
    assert not bool(Results.success != Results.success)
    assert not bool(Results.success == Results.diverged)

    @jax.jit
    def compare(case):
        # The constant cases compare at trace time, the argument at run time.
        assert not (Results.success == Results.diverged)  # noqa: SIM201
        return case == Results.diverged

    assert bool(compare(Results.diverged))
    assert not bool(compare(Results.success))


@pytest.mark.parametrize(
    "other", [0, "success", MoreResults.success], ids=["int", "str", "subclass"]
)
def test_comparing_with_anything_else_is_an_error(other):
    with pytest.raises(ValueError, match="only be compared with another case"):
        _ = Results.success == other
    with pytest.raises(ValueError, match="only be compared with another case"):
        _ = Results.success != other


def test_cases_are_not_hashable():
    # `==` returns an array, so a hash would not agree with it.
    with pytest.raises(TypeError):
        hash(Results.success)


def test_a_subclass_has_its_bases_cases_and_promotes_them():
    assert MoreResults[MoreResults.diverged] == "the iteration diverged"
    promoted = MoreResults.promote(Results.diverged)
    assert bool(promoted == MoreResults.diverged)
    traced = jax.jit(MoreResults.promote)(Results.diverged)
    assert bool(traced == MoreResults.diverged)
    with pytest.raises(ValueError, match="base enumerations"):
        MoreResults.promote(MoreResults.success)
    with pytest.raises(ValueError, match="base enumerations"):
        Results.promote(MoreResults.success)
    with pytest.raises(ValueError, match="base enumerations"):
        MoreResults.promote(0)  # type: ignore[arg-type]


def test_a_redefined_case_keeps_its_place_and_warns():
    with pytest.warns(UserWarning, match="defined twice with different messages"):

        class Renamed(Results):
            diverged = "blew up"

    assert Renamed[Renamed.diverged] == "blew up"
    assert bool(Renamed.promote(Results.diverged) == Renamed.diverged)
    assert len(Renamed) == 2


def test_where_chooses_a_case_at_run_time():
    @jax.jit
    def check(x):
        return Results.where(x < 10.0, Results.success, Results.diverged)

    assert bool(check(1.0) == Results.success)
    assert bool(check(100.0) == Results.diverged)
    batch = jax.vmap(check)(jnp.array([1.0, 100.0]))
    assert Results[batch] == "['' 'the iteration diverged']"
    with pytest.raises(ValueError, match="scalar boolean"):
        Results.where(jnp.array([True]), Results.success, Results.diverged)
    with pytest.raises(ValueError, match="cases of Results"):
        Results.where(True, Results.success, MoreResults.diverged)


def test_a_traced_case_has_no_message_until_it_is_known():
    messages = []

    @fx.filter_jit
    def look(case):
        messages.append(Results[case])
        return case.is_traced()

    assert look(Results.diverged) is True
    assert messages == ["traced"]
    assert not Results.diverged.is_traced()


def test_error_if_raises_the_cases_message():
    x = jnp.array([1.0, 2.0])
    assert Results.diverged.error_if(x, x.sum() > 10.0) is not None
    compiled = fx.filter_jit(lambda x: Results.diverged.error_if(x, x.sum() > 10.0))
    with pytest.raises(fx.FilteraxRuntimeError, match="the iteration diverged"):
        compiled(jnp.array([20.0, 1.0]))
    # The case's index is an array: the check is made as it runs, even with a
    # predicate known at once (as in Equinox).
    for known in (True, jnp.array(True)):
        with pytest.raises(fx.FilteraxRuntimeError, match="iteration diverged"):
            Results.diverged.error_if(x, known)

    @fx.filter_jit
    def chosen(x):
        case = Results.where(x.sum() > 10.0, Results.diverged, Results.success)
        return case.error_if(x, x.sum() > 10.0)

    np.testing.assert_array_equal(chosen(x), x)
    with pytest.raises(fx.FilteraxRuntimeError, match="the iteration diverged"):
        chosen(jnp.array([20.0, 1.0]))


def test_cases_pass_through_modules_serialisation_and_pickle():
    class Outcome(fx.Module):
        value: jax.Array
        result: fx.EnumerationItem

    outcome = fx.filter_jit(lambda o: o)(Outcome(jnp.ones(2), Results.diverged))
    assert bool(outcome.result == Results.diverged)
    buffer = io.BytesIO()
    fx.tree_serialise_leaves(buffer, Results.diverged)
    buffer.seek(0)
    loaded = fx.tree_deserialise_leaves(buffer, Results.success)
    assert bool(loaded == Results.diverged)
    assert bool(pickle.loads(pickle.dumps(Results.diverged)) == Results.diverged)


def test_bad_declarations_are_refused():
    with pytest.raises(ValueError, match="cannot have a case named 'where'"):

        class Where(fx.Enumeration):
            where = "x"

    with pytest.raises(ValueError, match="can only subclass enumerations"):

        class Mixed(Results, int):  # type: ignore[misc]
            pass

    with pytest.raises(TypeError, match="must be given a message string"):

        class Numbered(fx.Enumeration):
            first = 1

    with pytest.raises(TypeError, match="not made by calling it"):
        Results()
    with pytest.raises(AttributeError, match="no case 'missing'; its cases are"):
        _ = Results.missing
    with pytest.raises(ValueError, match="takes a case of Results"):
        _ = Results[MoreResults.success]


def test_a_case_whose_index_was_replaced_prints_as_unknown():
    abstract = fx.filter_eval_shape(lambda: Results.diverged)
    assert Results[abstract] == "unknown"
    assert repr(abstract) == f"{__name__}.Results<unknown>"
    arrays, _ = fx.partition(Results.diverged, fx.is_inexact_array)
    assert repr(arrays) == f"{__name__}.Results<unknown>"
