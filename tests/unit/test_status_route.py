"""The GEMM-path status report's way out (nodes/status_report.py, nodes/status_nodes.py): the route's query
parameters and responses, publish() to a stand-in PromptServer, route registration; real models from a synthetic
checkpoint on the CPU (tests/status_checks.py)."""

from __future__ import annotations

import json
import logging
import sys
import types

import pytest
from comfyui_ideogram4_int8.kernels import REGISTRY, settings
from comfyui_ideogram4_int8.nodes import status_report as status
from status_checks import clean_registry_around, load_and_run, validate

# -- query parameters and responses ---------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean_registry(setting):
    yield from clean_registry_around(setting)


class MultiDict:
    """The part of aiohttp's MultiDictProxy the validator uses (repeated keys kept)."""

    def __init__(self, pairs):
        self.pairs = list(pairs)

    def keys(self):
        return [k for k, _ in self.pairs]

    def __contains__(self, key):
        return key in self.keys()

    def __len__(self):
        return len(self.pairs)

    def getall(self, key):
        return [v for k, v in self.pairs if k == key]


@pytest.mark.parametrize(
    ("query", "model", "layers"),
    [
        ({}, None, True),
        (None, None, True),
        ({"layers": "0"}, None, False),
        ({"layers": "False"}, None, False),
        ({"layers": " on "}, None, True),
        ({"model": "conditional", "layers": "yes"}, "conditional", True),
        (MultiDict([("model", "unconditional#2")]), "unconditional#2", True),
    ],
)
def test_good_params(query, model, layers):
    assert status.validate_status_params(query) == status.StatusParams(model=model, include_layers=layers)


@pytest.mark.parametrize(
    ("query", "parameter", "fragment"),
    [
        ({"layer": "1"}, "layer", "unknown query parameter 'layer'"),
        ({"x" * 5000: "1"}, "x" * 40 + "...", "unknown query parameter 'xxxx"),
        ({"layers": "maybe"}, "layers", "'layers' must be 1 or 0"),
        ({"layers": ""}, "layers", "'layers' must be 1 or 0"),
        ({"model": ""}, "model", "'model' is empty"),
        ({"model": "x" * 500}, "model", "at most 200"),
        ({"model": "a\nb"}, "model", "printable"),
        (MultiDict([("model", "a"), ("model", "b")]), "model", "given 2 times"),
        (MultiDict([("layers", "1"), ("layers", "0")]), "layers", "given 2 times"),
    ],
)
def test_bad_params_name_the_parameter(query, parameter, fragment):
    with pytest.raises(status.StatusQueryError) as err:
        status.validate_status_params(query)
    assert err.value.status == 400
    assert err.value.parameter == parameter
    assert fragment in str(err.value)
    body = err.value.as_dict()
    assert body["parameter"] == parameter and fragment in body["error"]


def test_status_response_codes(tmp_path, gen, monkeypatch):
    code, body = status.status_response({"layers": "perhaps"})
    assert code == 400 and body["parameter"] == "layers"
    code, body = status.status_response({"model": "conditional"})
    assert code == 404 and body["parameter"] == "model" and body["known"] == []
    load_and_run(tmp_path, gen, branches=("conditional",), steps=1)
    code, body = status.status_response({"model": "conditional", "layers": "0"})
    assert code == 200
    validate(body)

    def boom(*a, **k):
        raise RuntimeError("secret internals at /home/x")

    monkeypatch.setattr(status, "status_report", boom)
    code, body = status.status_response({})
    assert code == 500
    assert "Traceback" not in json.dumps(body) and "/home/x" not in json.dumps(body)
    assert "RuntimeError" in body["error"]


# -- publish() and route registration (nodes/status_nodes.py, with a stand-in PromptServer) ------


class FakeServer:
    def __init__(self, fail=False):
        self.sent = []
        self.fail = fail
        self.routes = None

    def send_sync(self, event, data, sid=None):
        if self.fail:
            raise RuntimeError("loop closed")
        self.sent.append((event, json.loads(json.dumps(data))))


@pytest.fixture
def fake_server(monkeypatch):
    server = FakeServer()
    module = types.ModuleType("server")
    module.PromptServer = types.SimpleNamespace(instance=server)
    monkeypatch.setitem(sys.modules, "server", module)
    return server


def test_publish_sends_schema_valid_compact_report(fake_server, tmp_path, gen):
    from comfyui_ideogram4_int8.nodes import status_nodes

    load_and_run(tmp_path, gen, steps=1)
    assert status_nodes.publish("run", ["conditional", "unconditional"], node_id=7) is True
    ((event, payload),) = fake_server.sent
    assert event == "ideogram4_int8.status"
    assert payload["event"] == "run" and payload["node_id"] == "7"
    assert payload["models"] == ["conditional", "unconditional"]
    validate(payload["report"])
    assert all(m["layers"] is None for m in payload["report"]["models"])
    assert [m["label"] for m in payload["report"]["models"]] == ["conditional", "unconditional"]


def test_calls_of_the_last_run_are_counted_apart_from_the_total(tmp_path, gen, monkeypatch):
    # two runs of the same models (ComfyUI: two prompts): 'calls' adds them up, 'calls_last_run' is the last one
    run = {"id": "prompt-A"}
    monkeypatch.setattr(REGISTRY, "run_key_source", lambda: run["id"])
    load_and_run(tmp_path, gen, steps=3)
    run["id"] = "prompt-B"
    load_and_run(tmp_path, gen, steps=2)
    report = status.status_report()
    validate(report)
    for model in report["models"]:
        ran = [x for x in model["layers"] if x["calls"]]
        assert ran, model["label"]
        for layer in ran:
            assert layer["last_run"] == "prompt-B" and 2 * layer["calls"] == 5 * layer["calls_last_run"], layer
        assert model["last_run"] == "prompt-B"
        assert model["calls"] == sum(x["calls"] for x in ran)
        assert model["calls_last_run"] == sum(x["calls_last_run"] for x in ran) < model["calls"]
    assert report["last_prompt_id"] == "prompt-B"


def test_without_comfyui_runs_are_numbered_by_begin_run(tmp_path, gen):
    REGISTRY.begin_run()
    load_and_run(tmp_path, gen, steps=1)
    REGISTRY.begin_run()
    load_and_run(tmp_path, gen, steps=1)
    model = status.status_report()["models"][0]
    assert model["last_run"] == REGISTRY.run_key() and model["calls"] == 2 * model["calls_last_run"] > 0


def test_publish_ties_each_node_to_its_type_run_and_files(fake_server, monkeypatch):
    from comfyui_ideogram4_int8.nodes import status_nodes

    monkeypatch.setattr(status_nodes, "current_prompt_id", lambda: "prompt-A")
    source = {"weights": "a.safetensors", "unconditional_weights": "b.safetensors"}
    status_nodes.publish("load", ["conditional", "unconditional"], node_id=8, node_type="Ideogram4Int8Loader",
                         source=source)  # fmt: skip
    monkeypatch.setattr(status_nodes, "current_prompt_id", lambda: "prompt-B")
    status_nodes.publish("run", ["conditional"], node_id=9, node_type="Ideogram4Int8Sampler")
    payload = fake_server.sent[-1][1]
    assert payload["prompt_id"] == "prompt-B"
    report = payload["report"]
    validate(report)
    assert report["nodes"]["8"] == {
        "node_type": "Ideogram4Int8Loader",
        "event": "load",
        "prompt_id": "prompt-A",
        "models": ["conditional", "unconditional"],
        "source": source,
    }
    assert report["nodes"]["9"]["prompt_id"] == "prompt-B" and report["nodes"]["9"]["source"] is None
    assert report["last_prompt_id"] == "prompt-B"
    status_nodes.publish("load", None, node_id=None)  # no node: nothing remembered
    assert set(status.status_report()["nodes"]) == {"8", "9"}


def test_publish_never_raises(fake_server, monkeypatch, caplog):
    from comfyui_ideogram4_int8.nodes import status_nodes

    fake_server.fail = True
    assert status_nodes.publish("load") is False
    assert "could not push the GEMM status" in caplog.text
    monkeypatch.setitem(sys.modules, "server", None)  # no ComfyUI at all
    assert status_nodes.publish("run") is False

    def boom(**kw):
        raise MemoryError("report")

    monkeypatch.setattr(status_nodes._status, "status_report", boom)
    assert status_nodes.publish("run") is False


def test_publish_is_quiet_without_a_prompt_server(monkeypatch, caplog):
    """In-process use (scripts, benchmarks): no server, nothing to push, nothing to warn about (issue 27)."""
    from comfyui_ideogram4_int8.nodes import status_nodes

    no_class, no_instance = types.ModuleType("server"), types.ModuleType("server")
    no_instance.PromptServer = types.SimpleNamespace(instance=None)
    for module in (None, no_class, no_instance):  # not importable / a ComfyUI that serves nothing
        monkeypatch.setitem(sys.modules, "server", module)
        assert status_nodes.publish("run") is False
    monkeypatch.delitem(sys.modules, "server")  # never imported: publish must not import it either
    assert status_nodes.publish("run") is False and "server" not in sys.modules
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == [], caplog.text


def test_on_load_survives_a_missing_server(monkeypatch, setting, caplog):
    import asyncio

    from comfyui_ideogram4_int8.nodes import status_nodes

    module = types.ModuleType("server")  # a ComfyUI without PromptServer.instance
    module.PromptServer = types.SimpleNamespace()
    monkeypatch.setitem(sys.modules, "server", module)
    setting(settings.GEMM_TIMING, "1")
    asyncio.run(status_nodes.on_load())
    assert "routes not registered" in caplog.text
    assert REGISTRY.timing_enabled and status.status_report()["timing"]["switched_by"] == "env"


def test_routes_register_once():
    aiohttp_web = pytest.importorskip("aiohttp.web")
    from comfyui_ideogram4_int8.nodes import status_nodes

    routes = aiohttp_web.RouteTableDef()
    assert status_nodes.register_routes(routes) == ["GET /ideogram4_int8/status", "POST /ideogram4_int8/timing"]
    assert status_nodes.register_routes(routes) == []
    assert len(list(routes)) == 2


class FakeRoutes:
    """The two things register_routes uses of aiohttp's RouteTableDef: iteration and .route()."""

    def __init__(self):
        self.defs = []

    def __iter__(self):
        return iter(self.defs)

    def route(self, method, path):
        def deco(handler):
            self.defs.append(types.SimpleNamespace(method=method, path=path, handler=handler))
            return handler

        return deco


def test_routes_register_once_without_aiohttp():
    from comfyui_ideogram4_int8.nodes import status_nodes

    routes = FakeRoutes()
    routes.route("GET", "/other")(lambda r: None)
    assert status_nodes.register_routes(routes) == ["GET /ideogram4_int8/status", "POST /ideogram4_int8/timing"]
    assert status_nodes.register_routes(routes) == []
    assert [(d.method, d.path) for d in routes] == [
        ("GET", "/other"),
        ("GET", "/ideogram4_int8/status"),
        ("POST", "/ideogram4_int8/timing"),
    ]


def test_route_handlers_answer_json_over_http(tmp_path, gen):
    """The aiohttp handlers end to end (aiohttp comes with the test extra, as with ComfyUI)."""
    pytest.importorskip("aiohttp")
    import asyncio

    from aiohttp import web
    from aiohttp.test_utils import TestClient, TestServer
    from comfyui_ideogram4_int8.nodes import status_nodes

    load_and_run(tmp_path, gen, branches=("conditional",), steps=1)

    async def scenario():
        routes = web.RouteTableDef()
        status_nodes.register_routes(routes)
        app = web.Application()
        app.add_routes(routes)
        async with TestClient(TestServer(app)) as client:
            ok = await client.get("/ideogram4_int8/status?layers=1")
            body = await ok.json()
            bad = await client.get("/ideogram4_int8/status?layers=maybe")
            missing = await client.get("/ideogram4_int8/status?model=nope")
            timing_bad = await client.post("/ideogram4_int8/timing", data="not json")
            timing_on = await client.post("/ideogram4_int8/timing", json={"enabled": True})
            after = await (await client.get("/ideogram4_int8/status?layers=0")).json()
            return (
                ok.status,
                body,
                bad.status,
                await bad.json(),
                missing.status,
                timing_bad.status,
                timing_on.status,
                after,
            )

    ok, body, bad, bad_body, missing, timing_bad, timing_on, after = asyncio.run(scenario())
    assert ok == 200
    validate(body)
    assert body["models"][0]["label"] == "conditional"
    assert bad == 400 and bad_body["parameter"] == "layers" and "Traceback" not in json.dumps(bad_body)
    assert missing == 404 and timing_bad == 400 and timing_on == 200
    assert after["timing"]["enabled"] is True and after["timing"]["switched_by"] == "setting"
