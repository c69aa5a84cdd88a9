"""An in-process :class:`kindex.LLMClient` for generation tests: scripted answers, every call recorded.

It answers the way the HTTP fake (``tests.fakellm``) does when it is well behaved, but without a socket, litellm
or a thread, so a test of the pipeline (cache, merge, fallbacks, sanitising, cancellation) runs in milliseconds and
can assert on exactly which prompts were sent. The litellm adapter itself is tested against ``tests.fakellm``.

Answers are scripted per prompt kind: ``root`` (the top-level index), ``doc`` (one document's entry), ``repair``
(the re-ask after an unusable answer), and per document path with ``by_path``. Each script is an answer or a
function of the :class:`Call` returning one; an answer is the text, a :class:`kindex.Completion`, or an exception
to raise (``call_error()`` gives the :class:`kindex.ModelCallError` a real adapter raises after its retries).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from kindex import Completion, LLMClient, ModelCallError

Answer = str | Completion | BaseException
Script = Answer | Callable[["Call"], Answer]

PROMPT_TOKENS = 100
COMPLETION_TOKENS = 20


@dataclass(frozen=True)
class Call:
    """One call the generator made: the conversation sent and the schema it asked for."""

    messages: tuple[dict[str, str], ...]
    json_schema: Mapping[str, Any]
    errors_before: int = 0
    """How many calls the client had answered with an exception when this one was made."""
    max_tokens: int | None = None
    """The answer length the generator asked for (``None``: the client's configured cap)."""

    @property
    def user(self) -> str:
        """The first user message: the prompt kindex rendered from its templates."""
        return next(m["content"] for m in self.messages if m["role"] == "user")

    @property
    def system(self) -> str:
        return next(m["content"] for m in self.messages if m["role"] == "system")

    @property
    def kind(self) -> Literal["root", "doc"]:
        return "root" if "Theme folders" in self.user else "doc"

    @property
    def repair(self) -> bool:
        """Whether this is the re-ask after an unusable answer (the conversation then carries that answer)."""
        return any(m["role"] == "assistant" for m in self.messages)

    @property
    def path(self) -> str | None:
        """The document path the prompt names (relative to its theme), ``None`` for the root prompt."""
        if self.kind == "root":
            return None
        m = re.search(r"^Document path: (.+)$", self.user, re.MULTILINE)
        if m is None:
            raise AssertionError(f"a document prompt without its path: {self.user[:200]!r}")
        return m.group(1)

    @property
    def label(self) -> str:
        """``ROOT`` or the document path: what a test compares lists of calls by."""
        return self.path or "ROOT"

    @property
    def excerpt(self) -> str:
        return self.user.split("<<<\n", 1)[1].split("\n>>>", 1)[0]

    @property
    def root_dirs(self) -> list[str]:
        return re.findall(r"^- dir: (\S+)", self.user, re.MULTILINE)

    @property
    def root_paths(self) -> list[str]:
        return re.findall(r"^- path: (.+)$", self.user, re.MULTILINE)


def good_doc(call: Call) -> dict[str, Any]:
    """The entry a model that follows the instructions writes (the same as ``tests.fakellm.good_doc``)."""
    path = call.path
    return {"title": f"标题 {path}", "summary": f"关于 {path} 的摘要。", "tags": ["标签", path]}


def good_root(call: Call) -> dict[str, Any]:
    return {
        "themes": [{"dir": d, "title": f"主题 {d}", "summary": f"{d} 的内容", "tags": [d]} for d in call.root_dirs],
        "documents": [{"path": p, "title": f"根 {p}", "summary": f"{p} 摘要", "tags": ["根"]} for p in call.root_paths],
    }


def well_behaved(call: Call) -> str:
    """A model that follows the instructions, for either kind of prompt."""
    obj = good_root(call) if call.kind == "root" else good_doc(call)
    return json.dumps(obj, ensure_ascii=False)


def call_error(
    message: str = "InternalServerError (HTTP 500) after 3 attempts: boom",
    retries: int = 2,
    *,
    unreachable: bool = False,
) -> ModelCallError:
    """What a real adapter raises when a call failed after its retries (``unreachable``: no server was reached)."""
    return ModelCallError(message, retries, unreachable=unreachable)


class FakeClient:
    """Answers each call from its scripts and records it in ``calls`` (in the order the calls were made)."""

    def __init__(
        self,
        *,
        root: Script = well_behaved,
        doc: Script = well_behaved,
        repair: Script | None = None,
        by_path: Mapping[str, Script] | None = None,
        delay: float = 0.0,
    ) -> None:
        self.root = root
        self.doc = doc
        self.repair = repair
        """For the re-ask after an unusable answer; ``None``: the script of the original prompt answers again."""
        self.by_path: dict[str, Script] = dict(by_path or {})
        """Scripts for single documents (by the path the prompt names), before ``doc``."""
        self.delay = delay
        self.calls: list[Call] = []
        self.raised: list[Call] = []
        """The calls answered with an exception, in the order they were raised."""
        self.in_flight = 0
        self.max_in_flight = 0

    def script_for(self, call: Call) -> Script:
        if call.repair and self.repair is not None:
            return self.repair
        if call.kind == "root":
            return self.root
        assert call.path is not None
        return self.by_path.get(call.path, self.doc)

    async def complete(
        self, messages: Sequence[Mapping[str, str]], *, json_schema: Mapping[str, Any], max_tokens: int | None = None
    ) -> Completion:
        call = Call(tuple(dict(m) for m in messages), json_schema, len(self.raised), max_tokens)
        self.calls.append(call)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)  # even 0 yields to the loop, so concurrent calls overlap as real ones do
            script = self.script_for(call)
            answer = script(call) if callable(script) else script
        finally:
            self.in_flight -= 1
        if isinstance(answer, BaseException):
            self.raised.append(call)
            raise answer
        if isinstance(answer, Completion):
            return answer
        return Completion(answer, PROMPT_TOKENS, COMPLETION_TOKENS)

    # -- views for assertions ----------------------------------------------------------------------------------

    def labels(self) -> list[str]:
        """``ROOT`` or the document path of every call, sorted (repair calls included)."""
        return sorted(c.label for c in self.calls)

    def doc_calls(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "doc"]

    def root_calls(self) -> list[Call]:
        return [c for c in self.calls if c.kind == "root"]


def _conforms(client: FakeClient) -> LLMClient:
    return client  # mypy checks here that FakeClient implements the protocol generation takes
