"""Strict JSON: non-finite floats as strings, numpy values as plain numbers, one error shape."""

import math

import numpy as np
from werkzeug import test as werkzeug_test
from werkzeug import wrappers

from tb_numerics_plugin.plugin import errors, responses
from test_plugin_helpers import strict_json


def _body(payload, code=200):
    @wrappers.Request.application
    def app(request):
        return responses.json_response(request, payload, code=code)

    response = werkzeug_test.Client(app).get("/")
    assert response.mimetype == "application/json" and response.status_code == code
    return strict_json(response.get_data(as_text=True))


def test_non_finite_floats_travel_as_strings():
    body = _body({"v": [math.nan, math.inf, -math.inf, 1.5]})
    assert body == {"v": ["NaN", "Infinity", "-Infinity", 1.5]}


def test_numpy_scalars_and_arrays_become_plain_json():
    payload = {"i": np.int64(7), "f": np.float32(np.nan), "b": np.bool_(True),
               "a": np.array([1.0, np.inf]), "t": (1, 2)}
    assert _body(payload) == {"i": 7, "f": "NaN", "b": True, "a": [1.0, "Infinity"], "t": [1, 2]}


def test_already_safe_bodies_are_sent_unchanged():
    payload = {"items": [{"health": {"neg_inf": 3, "mean": "NaN"}, "name": "Log"}], "total": 1}
    assert _body(payload) == payload


def test_error_shape_names_code_message_and_parameter():
    @wrappers.Request.application
    def app(request):
        return responses.error_response(request, 404, "no run named 'x'", "run")

    response = werkzeug_test.Client(app).get("/")
    assert response.status_code == 404
    assert strict_json(response.get_data(as_text=True)) == {
        "error": {"code": 404, "message": "no run named 'x'", "parameter": "run"}
    }


class _Handlers:
    @responses.json_route
    def boom(self, query):
        raise RuntimeError("a bug in the plugin")

    @responses.json_route
    def unreadable(self, query):
        raise errors.UnreadableDataError("run 'r' holds data that cannot be served (X)", "run")

    @responses.json_route
    def echo(self, query):
        return {"n": query.integer("n", required=True)}


def test_unexpected_exceptions_are_logged_and_answered_as_a_json_500(caplog):
    response = werkzeug_test.Client(_Handlers().boom).get("/?x=1")
    assert response.status_code == 500
    assert strict_json(response.get_data(as_text=True))["error"]["code"] == 500
    assert any("a bug in the plugin" in r.exc_text for r in caplog.records if r.exc_text)


def test_typed_parameter_errors_become_400_without_logging(caplog):
    response = werkzeug_test.Client(_Handlers().echo).get("/?n=x")
    assert response.status_code == 400
    assert strict_json(response.get_data(as_text=True))["error"]["parameter"] == "n"
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_unreadable_data_is_a_json_422_naming_the_run():
    response = werkzeug_test.Client(_Handlers().unreadable).get("/")
    assert response.status_code == 422
    assert strict_json(response.get_data(as_text=True)) == {"error": {
        "code": 422, "message": "run 'r' holds data that cannot be served (X)", "parameter": "run"}}
