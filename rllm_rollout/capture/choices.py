"""One choice of a chat / completions response, accumulated over stream chunks (or read from a JSON body).

vLLM streams a choice as deltas: text pieces, token ids and logprobs per chunk, tool-call argument fragments
merged by `tool_calls[i].index`. `Choice` keeps those aligned and notes where the logprobs stop covering the
token ids one by one (a Step is trained on logprobs only when they cover every id). Kept apart from the
assembler: this is what a choice *is*, the assembler is how bytes become choices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rllm_rollout.capture import _json

__all__ = ["MAX_GAPS", "Choice", "choice_index", "logprobs_of"]

MAX_GAPS = 5
"""How many logprob gaps a Step's `metadata["logprobs_incomplete"]` spells out (the rest are counted)."""


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def choice_index(ch: dict[str, Any], pos: int) -> int:
    """A choice's `index`; its position in `choices` when the server sent none (or null, or junk)."""
    idx = ch.get("index")
    return idx if isinstance(idx, int) and not isinstance(idx, bool) and idx >= 0 else pos


def _text(value: Any) -> str:
    """Tool-call names/arguments as text: some servers send arguments as an object instead of a JSON string."""
    if isinstance(value, str):
        return value
    return "" if value is None else _json.dumps(value).decode()


def logprobs_of(lp: Any) -> tuple[list[float | None] | None, list[str] | None]:
    """(sampled-token logprobs, their token strings) from either shape: chat (`content[*].logprob` / `.token`)
    or completions (`token_logprobs` / `tokens`); a None logprob where the server sent null (or junk)."""
    if not isinstance(lp, dict):
        return None, None
    if "content" in lp:
        content = lp.get("content")
        if not isinstance(content, list):
            return None, None
        entries = [e if isinstance(e, dict) else {} for e in content]
        return [_num(e.get("logprob")) for e in entries], [str(e.get("token", "")) for e in entries]
    values, tokens = lp.get("token_logprobs"), lp.get("tokens")
    return ([_num(v) for v in values] if isinstance(values, list) else None,
            [str(t) for t in tokens] if isinstance(tokens, list) else None)


@dataclass(slots=True)
class Choice:
    """One choice, accumulated over chunks (or read at once from a JSON body)."""

    text: list[str] = field(default_factory=list)
    token_ids: list[int] | None = None
    logprobs: list[float | None] | None = None
    """One per token id; None where the server gave no number (then the Step trains on none of them)."""
    logprob_tokens: list[str] | None = None
    """The token strings the server gave with its logprobs (chat `content[*].token`): what retokenized ids must
    match, one by one, before its logprobs may be trained on."""
    prompt_token_ids: list[int] | None = None
    token_versions: list[int | None] | None = None
    """The policy version of each token id, where the server says (None where a chunk or body did not)."""
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    gaps: list[str] = field(default_factory=list)
    """Where the logprobs stopped covering the token ids one by one (the first few)."""
    gap_count: int = 0

    def add_versions(self, count: int, versions: Any, chunk_version: Any) -> None:
        """Versions of the `count` token ids just added: a body's per-token list, else the chunk's version."""
        if count <= 0:
            return
        if isinstance(versions, list) and len(versions) == count:
            got = [v if isinstance(v, int) and not isinstance(v, bool) else None for v in versions]
        else:
            one = chunk_version if isinstance(chunk_version, int) and not isinstance(chunk_version, bool) else None
            got = [one] * count
        self.token_versions = [*(self.token_versions or []), *got]

    def gap(self, why: str) -> None:
        self.gap_count += 1
        self.gaps += [why] if len(self.gaps) < MAX_GAPS else []

    def add_tokens(self, ids: Any, lps: list[float | None] | None, tokens: list[str] | None, where: str,
                   expect_lps: bool) -> None:
        """Token ids and logprobs of one chunk (or body), kept aligned: a chunk with ids but fewer logprobs
        is padded with None and noted, so the rest of the stream still lines up for inspection."""
        ids = [i for i in ids if isinstance(i, int)] if isinstance(ids, list) else None
        if lps is not None and None in lps:
            self.gap(f"{where}: {lps.count(None)} null logprob(s)")
        if ids is not None:
            if lps is None and ids and expect_lps:
                self.gap(f"{where}: {len(ids)} token id(s) without logprobs")
                lps = [None] * len(ids)
            elif lps is not None and len(lps) != len(ids):
                self.gap(f"{where}: {len(ids)} token id(s) but {len(lps)} logprob(s)")
                lps = lps + [None] * (len(ids) - len(lps))
            self.token_ids = ids if self.token_ids is None else [*self.token_ids, *ids]
        if lps is not None:
            self.logprobs = lps if self.logprobs is None else [*self.logprobs, *lps]
        if tokens is not None:
            self.logprob_tokens = tokens if self.logprob_tokens is None else [*self.logprob_tokens, *tokens]

    def merge_tool_calls(self, fragments: Any) -> None:
        if not isinstance(fragments, list):
            return
        for frag in fragments:
            if not isinstance(frag, dict):
                continue
            idx = frag.get("index")
            if not isinstance(idx, int) or isinstance(idx, bool):
                idx = self._unindexed(frag)
            slot = self.tool_calls.setdefault(idx, {"id": None, "type": "function",
                                                    "function": {"name": "", "arguments": ""}})
            if frag.get("id"):
                slot["id"] = frag["id"]
            if frag.get("type"):
                slot["type"] = frag["type"]
            fn = frag.get("function")
            if not isinstance(fn, dict):
                continue
            if fn.get("name"):
                slot["function"]["name"] += _text(fn["name"])
            if fn.get("arguments"):
                slot["function"]["arguments"] += _text(fn["arguments"])

    def _unindexed(self, frag: dict[str, Any]) -> int:
        """The call a fragment without `index` belongs to. OpenAI and vLLM always send `index`; servers that
        omit it send either whole calls (each with its id) or one call's pieces in order, a new call starting
        with a new id (or, without ids, with a name). So: a new id or a second name opens a new call, a known
        id goes to its call, anything else continues the latest call."""
        if not self.tool_calls:
            return 0
        last, fid, fn = max(self.tool_calls), frag.get("id"), frag.get("function")
        if fid:
            return next((k for k, slot in self.tool_calls.items() if slot["id"] == fid), last + 1)
        named = isinstance(fn, dict) and bool(fn.get("name"))
        return last + 1 if named and self.tool_calls[last]["function"]["name"] else last
