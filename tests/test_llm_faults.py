"""Provider faults on the wire: retries, backoff, Retry-After, timeouts, and what counts as fatal."""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

import kindex
from kindex import LiteLLMClient, LLMSettings, ModelCallError, ModelError, Options, llm
from kindex.errors import CancelledRun
from kindex.generators import DOC_SCHEMA
from tests.conftest import llm_settings
from tests.fakellm import FakeLLM, Reply, doc_path, is_root, well_behaved

MESSAGES = [{"role": "user", "content": "Document path: a.md\n"}]


def flaky(fault: Reply, times: int) -> Any:
    counter = itertools.count()

    def script(request: dict[str, Any]) -> Reply:
        return fault if next(counter) < times else Reply('{"title": "ok", "summary": "fine", "tags": []}')

    return script


def complete(server: FakeLLM, **overrides: Any) -> kindex.Completion:
    client = LiteLLMClient(llm_settings(server, **overrides))
    return asyncio.run(client.complete(MESSAGES, json_schema=DOC_SCHEMA))


@pytest.mark.parametrize(
    "fault",
    [
        Reply("slow down", status=429, headers={"Retry-After": "0"}),
        Reply("slow down", status=429),
        Reply("boom", status=500),
        Reply("bad gateway", status=502),
        Reply(drop=True),
        Reply(no_choices=True),
    ],
    ids=["429-retry-after", "429", "500", "502", "dropped-connection", "empty-choices"],
)
def test_transient_faults_are_retried_then_answered(fake_llm: FakeLLM, fault: Reply) -> None:
    fake_llm.script = flaky(fault, 2)

    completion = complete(fake_llm, retries=2)

    assert completion.text.startswith('{"title": "ok"')
    assert completion.retries == 2
    assert len(fake_llm.requests) == 3


def test_retry_after_is_honoured(fake_llm: FakeLLM) -> None:
    client = LiteLLMClient(llm_settings(fake_llm))
    fake_llm.script = flaky(Reply("slow", status=429, headers={"Retry-After": "7"}), 1)
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waits.append(seconds)

    async def run() -> None:
        original = asyncio.sleep
        asyncio.sleep = fake_sleep  # type: ignore[assignment]
        try:
            await client.complete(MESSAGES, json_schema=DOC_SCHEMA)
        finally:
            asyncio.sleep = original

    asyncio.run(run())
    assert waits == [7.0]


def test_a_hang_past_the_timeout_is_retried_and_then_reported(fake_llm: FakeLLM) -> None:
    fake_llm.script = lambda r: Reply(hang=True)

    with pytest.raises(ModelCallError, match=r"after 2 attempts") as failed:
        complete(fake_llm, timeout=0.5, retries=1)
    assert len(fake_llm.requests) == 2
    assert failed.value.retries == 1  # what the run report counts as this call's retries


def test_a_non_json_body_is_a_call_failure_not_a_crash(fake_llm: FakeLLM) -> None:
    fake_llm.script = lambda r: Reply(raw_body=b"<html>502 proxy error</html>")

    with pytest.raises(ModelCallError):
        complete(fake_llm, retries=1)


def _completion(usage: dict[str, Any], content: Any = '{"title": "ok", "summary": "fine", "tags": []}') -> bytes:
    message = {"role": "assistant", "content": content}
    choice = {"index": 0, "message": message, "finish_reason": "stop"}
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [choice], "usage": usage}
    return orjson.dumps(body)


def test_an_answer_litellm_cannot_read_fails_once_not_as_a_retried_outage(fake_llm: FakeLLM) -> None:
    # A float token count: litellm refused the response, kindex retried it as an HTTP 500 (or as a rate limit when
    # the quoted answer held "rate"), and the failure's reason held litellm's traceback with this machine's paths.
    usage = {"prompt_tokens": 10, "completion_tokens": 2.7, "total_tokens": "rate limit"}
    fake_llm.script = lambda r: Reply(raw_body=_completion(usage))

    with pytest.raises(ModelCallError) as raised:
        complete(fake_llm, retries=3)

    assert len(fake_llm.requests) == 1 and raised.value.transient is False
    assert raised.value.message.startswith("the server's answer is no chat completion litellm can read (")
    assert "Traceback" not in raised.value.message and "site-packages" not in raised.value.message


def test_an_entry_written_as_a_tool_call_is_the_answer(fake_llm: FakeLLM) -> None:
    # It failed as "the answer is empty": some models answer a JSON schema with a tool call.
    entry = '{"title": "ok", "summary": "fine", "tags": []}'
    call = {"id": "t", "type": "function", "function": {"name": "kindex_entry", "arguments": entry}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "usage": {}}
    body["choices"] = [{"index": 0, "message": message, "finish_reason": "tool_calls"}]
    fake_llm.script = lambda r: Reply(raw_body=orjson.dumps(body))

    assert complete(fake_llm).text == entry


def test_an_answer_that_is_all_reasoning_says_so(fake_llm: FakeLLM) -> None:
    message = {"role": "assistant", "content": "", "reasoning_content": "Let me think about the title..."}
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "usage": {}}
    body["choices"] = [{"index": 0, "message": message, "finish_reason": "length"}]
    fake_llm.script = lambda r: Reply(raw_body=orjson.dumps(body))

    with pytest.raises(ModelCallError, match="the model wrote only its reasoning, no answer: raise --max-tokens"):
        complete(fake_llm, retries=3)
    assert len(fake_llm.requests) == 1


def test_negative_token_counts_count_as_none(fake_llm: FakeLLM) -> None:
    usage = {"prompt_tokens": -5000, "completion_tokens": -3, "total_tokens": -5003}
    fake_llm.script = lambda r: Reply(raw_body=_completion(usage))

    completion = complete(fake_llm)

    assert (completion.prompt_tokens, completion.completion_tokens) == (0, 0)


@pytest.mark.parametrize(
    ("status", "check"),
    [
        (401, "(check the API key: the provider's variable, e.g. OPENAI_API_KEY, and that it may use this model)"),
        (404, "(check the model name: litellm's provider/model string, e.g. openai/gpt-4o-mini)"),
    ],
)
def test_an_authentication_error_stops_the_run(sample_kb: Path, fake_llm: FakeLLM, status: int, check: str) -> None:
    fake_llm.script = lambda r: Reply("invalid api key", status=status)

    with pytest.raises(ModelError, match="cannot be used") as raised:
        kindex.reindex(sample_kb, Options(llm=llm_settings(fake_llm), concurrency=2))
    assert len(fake_llm.requests) <= 2  # the calls already in flight; nothing is sent after the first refusal
    assert raised.value.message.endswith(check)  # litellm's text names the complaint, not the setting to fix


@pytest.mark.parametrize(
    ("fault", "reason", "requests", "counted", "transient"),
    [
        (Reply("down", status=503), "ServiceUnavailableError (HTTP 503) after 2 attempts", 20, (19, 1), True),
        # A 400 (a document too long for the model's context) is not one of litellm's APIErrors: it ended the run
        # with a traceback. The same request would be refused again: not retried, now or by a watcher later.
        (Reply('{"error": {"message": "context length"}}', status=400), "BadRequestError", 19, (19, 0), False),
    ],
    ids=["503", "400"],
)
def test_persistent_server_errors_fail_documents_but_not_the_run(
    sample_kb: Path,
    fake_llm: FakeLLM,
    fault: Reply,
    reason: str,
    requests: int,
    counted: tuple[int, int],
    transient: bool,
) -> None:
    def script(request: dict[str, Any]) -> Reply:
        if not is_root(request) and doc_path(request) == "离线模式.md":
            return fault
        return well_behaved(request)

    fake_llm.script = script
    report = kindex.reindex(sample_kb, Options(llm=llm_settings(fake_llm, retries=1)))

    assert [f.path for f in report.failures] == ["sync/离线模式.md"]
    assert reason in report.failures[0].reason and report.failures[0].transient is transient
    assert len(fake_llm.requests) == requests  # a failing call that may pass was sent twice, the others once
    assert (report.calls, report.retries) == counted  # a failed call and its retry are counted
    [problem] = kindex.validate(sample_kb)  # valid JSON, but validate names the stand-in until a step retries it
    assert problem.startswith("sync/离线模式.md: its entry is a stand-in") and reason in problem


def test_a_providers_error_text_reaches_no_terminal_as_control_characters(sample_kb: Path, fake_llm: FakeLLM) -> None:
    escape = "\x1b]0;OWNED\x07\x1b[2J"

    def script(request: dict[str, Any]) -> Reply:
        if not is_root(request) and doc_path(request) == "离线模式.md":
            return Reply(escape + "bad\nrequest", status=400)  # a body that is not JSON: its text as sent
        return well_behaved(request)

    fake_llm.script = script
    report = kindex.reindex(sample_kb, Options(llm=llm_settings(fake_llm, retries=0)))

    [failure] = report.failures
    assert failure.reason.endswith("OpenAIException - ]0;OWNEDbad request")  # the screen-clearing sequence gone
    assert not any(ord(c) < 32 for c in failure.reason)


def test_a_model_string_without_a_provider_is_a_usage_error_not_a_traceback(sample_kb: Path) -> None:
    # litellm's BadRequestError ("LLM Provider NOT provided") escaped as a 60-line traceback.
    from click.testing import CliRunner

    from kindex.cli import main

    for command in (["reindex"], ["reindex", "--dry-run"]):
        result = CliRunner().invoke(main, [*command, str(sample_kb), "--model", "mymodel"])
        assert result.exit_code == 2 and result.stdout == ""
        assert "Error: model 'mymodel' names no provider litellm knows: write it as provider/model" in result.stderr
    assert not (sample_kb / "index.json").exists()


def test_a_missing_api_key_stops_at_once_naming_the_variable(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    from click.testing import CliRunner

    from kindex.cli import main

    result = CliRunner().invoke(main, ["reindex", str(sample_kb), "--model", "openai/gpt-4o-mini"])

    assert result.exit_code == 1 and "needs OPENAI_API_KEY" in result.stderr
    assert not (sample_kb / "index.json").exists()


def test_a_library_call_fails_with_the_error_alone(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The sync API runs the step outside its "is a loop running?" check: the error is not chained to the
    # RuntimeError that check raises (a traceback that read "no running event loop" first).
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ModelError, match="needs OPENAI_API_KEY") as raised:
        kindex.reindex(sample_kb, Options(llm=LLMSettings(model="openai/gpt-4o-mini")))
    assert raised.value.__context__ is None and raised.value.__cause__ is None


def test_a_local_endpoint_needs_no_key(sample_kb: Path, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY")
    fake_llm.script = well_behaved
    report = kindex.reindex(sample_kb, Options(llm=llm_settings(fake_llm)))
    assert report.ok and report.calls > 0


def test_the_timeout_is_a_deadline_for_the_whole_call(fake_llm: FakeLLM) -> None:
    answer = '{"title": "t", "summary": "' + "s" * 2000 + '", "tags": []}'
    fake_llm.script = lambda r: Reply(answer, trickle=0.05)  # ~100 s to send, one byte well within each wait
    with pytest.raises(ModelCallError, match="deadline"):
        complete(fake_llm, timeout=1.0, retries=0)


def test_a_refused_connection_is_reported_as_such_not_as_http_500(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again on leaving: nothing listens there
    settings = kindex.LLMSettings(model="openai/fake", api_base=f"http://127.0.0.1:{port}/v1", timeout=5.0, retries=0)
    client = LiteLLMClient(settings)
    with pytest.raises(
        ModelCallError, match=rf"no connection after 1 attempt: cannot connect to http://127\.0\.0\.1:{port}/v1"
    ) as raised:
        asyncio.run(client.complete(MESSAGES, json_schema=DOC_SCHEMA))
    assert raised.value.unreachable


def test_a_run_whose_first_call_cannot_connect_stops_at_once(sample_kb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A wrong --api-base used to fail every document the same way, each after its retries (37 s on sample_kb, exit
    # 3 "run the command again"). While no call of the run has been answered, a refused connection ends the run.
    import socket

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again on leaving: nothing listens there
    settings = kindex.LLMSettings(model="openai/fake", api_base=f"http://127.0.0.1:{port}/v1", timeout=5.0, retries=0)
    check = "no call of this run has reached the model; check the API base (--api-base, KINDEX_API_BASE or [model]"
    with pytest.raises(ModelError, match=re.escape(check)) as raised:
        kindex.reindex(sample_kb, Options(llm=settings))
    assert not isinstance(raised.value, kindex.GenerationFailed)
    assert not (sample_kb / "index.json").exists()


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (Reply(drop=True), r"connection dropped after 1 attempt: http://127\.0\.0\.1:\d+/v1 closed the connection"),
        (Reply("upstream Connection error.", status=502), r"BadGatewayError \(HTTP 502\) after 1 attempt: .*upstream"),
    ],
)
def test_a_server_that_drops_the_connection_or_answers_an_error_was_reached(
    fake_llm: FakeLLM, reply: Reply, message: str
) -> None:
    # Neither may end a run as "no call reached the model": a server accepted the connection, or answered (a
    # gateway whose own upstream is down says "Connection error" in a 502, about another machine).
    fake_llm.script = lambda r: reply
    with pytest.raises(ModelCallError, match=message) as raised:
        complete(fake_llm, retries=0)
    assert not raised.value.unreachable


def test_a_host_that_never_accepts_the_connection_is_unreachable(monkeypatch: pytest.MonkeyPatch) -> None:
    # A firewalled host drops the connection attempt: the whole-call deadline used to fire first, saying only that
    # the call took too long, so a run against it failed every document after its retries instead of stopping.
    import socket

    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        pending = [socket.socket() for _ in range(4)]
        for sock in pending:  # fill the listen queue: a further SYN is dropped, as a firewall would
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
        try:
            settings = LLMSettings(model="openai/fake", api_base=f"http://127.0.0.1:{port}/v1", timeout=2.0, retries=0)
            with pytest.raises(ModelCallError, match="no connection after 1 attempt: cannot connect") as raised:
                asyncio.run(LiteLLMClient(settings).complete(MESSAGES, json_schema=DOC_SCHEMA))
            assert raised.value.unreachable
        finally:
            for sock in pending:
                sock.close()


def test_a_refused_connection_reported_only_in_the_message_is_no_connection_not_http_500() -> None:
    # Seen from a fresh virtualenv: litellm's InternalServerError (status 500) with no cause chain, the refusal
    # said only in the message. Before, this was reported as "InternalServerError (HTTP 500)".
    class InternalServerError(Exception):
        status_code = 500

    exc = InternalServerError("litellm.InternalServerError: InternalServerError: OpenAIException - Connection error.")
    assert llm._kind(exc) == "no connection"
    assert llm._kind(InternalServerError("upstream failed")) == "InternalServerError (HTTP 500)"


def test_a_dropped_litellm_call_prints_no_python_warning() -> None:
    # A run stopped early drops litellm's calls not yet started; their coroutine, made on an executor thread, was
    # reported on stderr as "coroutine 'OpenAIChatCompletion.acompletion' was never awaited".
    import gc
    import warnings

    from kindex.llm import import_litellm

    import_litellm()

    class OpenAIChatCompletion:
        async def acompletion(self) -> None:
            return None

    with warnings.catch_warnings(record=True) as seen:
        OpenAIChatCompletion().acompletion()  # type: ignore[unused-coroutine]
        gc.collect()
    assert not [w for w in seen if "was never awaited" in str(w.message)]


def test_a_provider_that_cannot_be_reached_is_not_blamed_on_an_api_base_never_given(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No network to the provider said "check --api-base" to a user who had given none.
    from tests.fakeclient import FakeClient, call_error

    client = FakeClient(root=call_error("cannot connect to api.openai.com", 4, unreachable=True))
    client.doc = client.root
    with pytest.raises(ModelError, match="no call of this run has reached the model; check this machine's network"):
        kindex.reindex(sample_kb, Options(llm=kindex.LLMSettings(model="openai/gpt-4o-mini"), client=client))


def test_a_run_ends_with_the_error_that_failed_it_whichever_task_reports_first(
    sample_kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A newcomer's run with no network once ended "stopped after a fatal model error", no cause: the error of a
    # call that found the run failed reached the top before the failed call's own.
    async def failed_elsewhere(self: Any) -> None:
        self.fatal = ModelError("cannot connect to the provider: no call of this run has reached the model")
        raise CancelledRun("stopped after a fatal model error")

    monkeypatch.setattr(kindex.generate._Runner, "reindex", failed_elsewhere)
    with pytest.raises(ModelError, match="no call of this run has reached the model"):
        kindex.reindex(sample_kb)
