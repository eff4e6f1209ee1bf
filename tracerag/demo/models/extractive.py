"""ExtractiveChatModel: an offline stand-in for a chat model, for demos and tests.

It is not a language model and generates no new text. It reads the materials and the question
in its prompt, scores every sentence of every material against the question, and answers with
one or more of those sentences copied verbatim, each followed by the id of the material it came
from. Temperature makes it sample among close candidates, so repeated calls disagree where the
materials are ambiguous and agree where one sentence clearly answers the question. It needs no
weights and no network.
"""

from __future__ import annotations

import ast
import html
import json
import math
import random
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import PrivateAttr

from tracerag._llm import ReplyChatModel, text_of
from tracerag._usage import estimate_tokens
from tracerag.demo.models._counter import CallCounter
from tracerag.errors import InputTypeError
from tracerag.prompts import (
    MATERIAL_BLOCK_RE,
    QUESTION_RE,
    TASK_ANSWER,
    TASK_PLAN,
    TASK_PLAN_AND_ANSWER,
    TASK_RE,
)
from tracerag.text._quantities import extract_quantities
from tracerag.text._sentences import split_sentences
from tracerag.text._words import content_terms

__all__ = ["ExtractiveChatModel"]

CANNOT_ANSWER_EN = "I cannot answer this from the provided materials."
CANNOT_ANSWER_ZH = "根据所提供的资料无法回答该问题。"

#: A sentence must cover at least this share of the question's (IDF-weighted) terms.
SCORE_FLOOR = 0.25
#: Only sentences scoring at least this share of the best one are candidates for an answer.
RELATIVE_FLOOR = 0.8
#: Bonus for a sentence with an amount, date or duration when the question asks for one.
QUANTITY_BONUS = 0.1
#: Sampling considers at most this many top-scoring sentences.
TOP_CANDIDATES = 5
#: softmax(score / (temperature * TEMPERATURE_SCALE)): at 0.7, a 0.05 score gap gives roughly a
#: 3:1 split and equal scores an even one.
TEMPERATURE_SCALE = 0.07

_CJK_CHARS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RE = re.compile(f"[{_CJK_CHARS}]")
_LATIN_WORD_RE = re.compile(r"[A-Za-z]+")
_PLAN_BLOCK_RE = re.compile(r"<plan>(?P<plan>.*?)</plan>", re.S)
_CLAUSE_RE = re.compile(
    r"(?:Clause|Section|Article|§)\s*\d+(?:\.\d+)*|第\s*\d+(?:\.\d+)*\s*条", re.IGNORECASE
)
_ASKS_QUANTITY_RE = re.compile(
    r"\b(?:how\s+(?:much|many|long|soon|often)|when|what\s+(?:date|time|day)|which\s+date"
    r"|cost|costs|fee|fees|price|deadline|until)\b"
    r"|多少|多久|多长|几天|几个|几次|几点|何时|什么时候|哪天|期限|费用|价格|金额|收费|日期",
    re.IGNORECASE,
)
_QUESTION_LABEL_RE = re.compile(
    r"(?:^|\n)[ \t]*(?:question|query|user question|问题|用户问题)[ \t]*[:：][ \t]*",
    re.IGNORECASE,
)
_CONTEXT_LABEL_RE = re.compile(
    r"(?:^|\n)[ \t]*(?:context|contexts|documents|sources|materials|上下文|资料|参考资料|文档)"
    r"[ \t]*[:：][ \t]*",
    re.IGNORECASE,
)
_TRAILING_LABEL_RE = re.compile(
    r"\n[ \t]*(?:answer|helpful answer|回答|答案)[ \t]*[:：][ \t]*\Z", re.IGNORECASE
)


@dataclass
class PromptMaterial:
    """A material as read back from a prompt: its id, title and sentences."""

    id: str
    title: str
    sentences: list[str]


@dataclass
class ParsedPrompt:
    """What a prompt asks: the task, the question, the materials and any planned material ids.

    ``foreign`` is True for prompts without ``<material>`` blocks, whose materials are the
    context's paragraphs with ids ``"1"``, ``"2"``, ….
    """

    task: str
    question: str
    materials: list[PromptMaterial]
    foreign: bool = False
    plan_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ScoredSentence:
    """One sentence of a material with its relevance score; ``order`` is its prompt position."""

    material_id: str
    sentence: str
    score: float
    order: int


def _is_chinese(text: str) -> bool:
    """Whether text is mainly Chinese (by CJK characters against Latin words)."""
    cjk = len(_CJK_RE.findall(text))
    return cjk > 0 and cjk >= len(_LATIN_WORD_RE.findall(text))


_ASKS_CITATIONS_RE = re.compile(r"\bcit(?:e|es|ing|ation|ations)\b|引用|注明出处|标注出处", re.I)


def asks_for_citations(messages: Sequence[BaseMessage]) -> bool:
    """Whether a prompt in tracerag's format asks for citations (outside its materials and
    question: in the system message or the instruction)."""
    text = "\n".join(_message_text(m) for m in messages)
    text = MATERIAL_BLOCK_RE.sub(" ", text)
    text = QUESTION_RE.sub(" ", text)
    return bool(_ASKS_CITATIONS_RE.search(text))


def _message_text(message: BaseMessage) -> str:
    return text_of(message, sep="\n")


def _sentences(text: str) -> list[str]:
    return list(_split_once(text))


# the model reads the same materials on every call: their sentences and terms are kept
@lru_cache(maxsize=1024)
def _split_once(text: str) -> tuple[str, ...]:
    return tuple(s.text.strip() for s in split_sentences(text) if s.text.strip())


@lru_cache(maxsize=8192)
def _sentence_terms(sentence: str) -> frozenset[str]:
    return frozenset(content_terms(sentence))


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def _parse_plan_ids(text: str) -> list[str]:
    match = _PLAN_BLOCK_RE.search(text)
    if not match:
        return []
    try:
        plan = json.loads(match.group("plan"))
    except ValueError:
        return []
    ids = plan.get("material_ids") if isinstance(plan, dict) else None
    return [str(i) for i in ids] if isinstance(ids, list) else []


def _context_of(text: str) -> tuple[str, bool]:
    """The text after the last "Context:" label (and whether there was one), else all of it."""
    found = list(_CONTEXT_LABEL_RE.finditer(text))
    return (text[found[-1].end() :], True) if found else (text, False)


def _parse_foreign(human: str, earlier: Sequence[str]) -> tuple[str, list[PromptMaterial]]:
    """Question and materials of a prompt without ``<material>`` blocks.

    The question is the text after the last "Question:" label of the last human message, or
    its last line. Materials are the paragraphs (separated by blank lines) of the context:
    the text after a "Context:" label, else everything before the question. When the human
    message holds only the question, the earlier messages are read the same way (without a
    label, their first paragraph is taken to be the instruction, not a material).
    """
    body = _TRAILING_LABEL_RE.sub("", human.rstrip())
    labels = list(_QUESTION_LABEL_RE.finditer(body))
    if labels:
        question = body[labels[-1].end() :].strip()
        before = body[: labels[-1].start()]
    else:
        lines = [ln for ln in body.splitlines() if ln.strip()]
        question = lines[-1].strip() if lines else ""
        before = body[: body.rfind(question)] if question else body
    context, _ = _context_of(before)
    if not _paragraphs(context) and earlier:
        context, labelled = _context_of("\n\n".join(earlier))
        if not labelled:
            context = "\n\n".join(_paragraphs(context)[1:])
    materials = [
        PromptMaterial(id=str(i), title="", sentences=_sentences(p))
        for i, p in enumerate(_paragraphs(context), start=1)
    ]
    return question, [m for m in materials if m.sentences]


_SOURCE_RE = re.compile(r"\A\s*Source:\s*(?P<meta>\{.*?\})\s*\n\s*Content:\s*(?P<text>.*)\Z", re.S)


def _tool_passage(position: int, passage: str) -> PromptMaterial:
    """A passage of a tool result: ``Source: {metadata}`` / ``Content: …``, or plain text."""
    match = _SOURCE_RE.match(passage)
    if match is None:
        return PromptMaterial(id=str(position), title="", sentences=_sentences(passage))
    try:
        meta = ast.literal_eval(match.group("meta"))
    except (ValueError, SyntaxError):
        meta = {}
    meta = meta if isinstance(meta, dict) else {}
    return PromptMaterial(
        id=str(meta.get("id") or position),
        title=str(meta.get("title") or ""),
        sentences=_sentences(match.group("text")),
    )


def _parse_tool_results(question: str, results: Sequence[str]) -> ParsedPrompt:
    passages = [p for text in results for p in _paragraphs(text)]
    materials = [_tool_passage(i, p) for i, p in enumerate(passages, start=1)]
    return ParsedPrompt(
        task=TASK_ANSWER,
        question=question.strip(),
        materials=[m for m in materials if m.sentences],
        foreign=True,
    )


def parse_prompt(messages: Sequence[BaseMessage]) -> ParsedPrompt:
    """The task, question and materials of a prompt (tracerag's format, or a foreign one)."""
    last_human = max(
        (i for i, m in enumerate(messages) if isinstance(m, HumanMessage)),
        default=len(messages) - 1,
    )
    human_text = _message_text(messages[last_human]) if messages else ""
    results = [_message_text(m) for m in messages[last_human + 1 :] if isinstance(m, ToolMessage)]
    if results:  # an agent's conversation: the question, then what its tools returned
        return _parse_tool_results(human_text, results)
    blocks = list(MATERIAL_BLOCK_RE.finditer(human_text))
    if not blocks:
        earlier = [_message_text(m) for m in messages[:last_human]]
        question, materials = _parse_foreign(human_text, [t for t in earlier if t.strip()])
        return ParsedPrompt(task=TASK_ANSWER, question=question, materials=materials, foreign=True)
    task_match = TASK_RE.search(human_text)
    question_match = QUESTION_RE.search(human_text)
    materials = [
        PromptMaterial(
            id=html.unescape(b.group("id")),
            title=html.unescape(b.group("title") or ""),
            sentences=_sentences(b.group("text")),
        )
        for b in blocks
    ]
    return ParsedPrompt(
        task=task_match.group("task") if task_match else TASK_ANSWER,
        question=question_match.group("q").strip() if question_match else "",
        materials=[m for m in materials if m.sentences],
        plan_ids=_parse_plan_ids(human_text),
    )


def score_sentences(question: str, materials: Sequence[PromptMaterial]) -> list[ScoredSentence]:
    """Every sentence scored by the IDF-weighted share of the question's terms it contains.

    IDF is computed over the materials in the prompt; a sentence with an amount, date or
    duration gets a small bonus when the question asks for one.
    """
    q_terms = set(content_terms(question))
    if not q_terms or not materials:
        return []
    material_terms = [[_sentence_terms(s) for s in m.sentences] for m in materials]
    n = len(materials)
    df = {t: sum(1 for sents in material_terms if any(t in s for s in sents)) for t in q_terms}
    idf = {t: math.log(1.0 + (n + 1) / (df[t] + 1)) for t in q_terms}
    total = sum(idf.values())
    asks_quantity = bool(_ASKS_QUANTITY_RE.search(question))
    scored: list[ScoredSentence] = []
    order = 0
    for material, sents in zip(materials, material_terms, strict=True):
        for sentence, terms in zip(material.sentences, sents, strict=True):
            score = sum(idf[t] for t in q_terms & terms) / total
            if score > 0 and asks_quantity and extract_quantities(sentence):
                score += QUANTITY_BONUS
            scored.append(ScoredSentence(material.id, sentence, score, order))
            order += 1
    return scored


def _softmax_pick(
    rng: random.Random, pool: list[ScoredSentence], temperature: float
) -> ScoredSentence:
    if temperature <= 0 or len(pool) == 1:
        return pool[0]
    scale = temperature * TEMPERATURE_SCALE
    best = pool[0].score
    weights = [math.exp((c.score - best) / scale) for c in pool]
    return rng.choices(pool, weights=weights, k=1)[0]


def _ranked(scored: Sequence[ScoredSentence]) -> list[ScoredSentence]:
    ranked = sorted(scored, key=lambda c: (-c.score, c.order))
    return [c for c in ranked if c.score >= SCORE_FLOOR][:TOP_CANDIDATES]


def strong_candidates(scored: Sequence[ScoredSentence]) -> list[ScoredSentence]:
    """The sentences close enough to the best one to be worth answering with, best first."""
    ranked = _ranked(scored)
    if not ranked:
        return []
    threshold = max(SCORE_FLOOR, RELATIVE_FLOOR * ranked[0].score)
    return [c for c in ranked if c.score >= threshold]


def select_sentences(
    scored: Sequence[ScoredSentence], max_sentences: int, temperature: float, rng: random.Random
) -> list[ScoredSentence]:
    """Up to ``max_sentences`` of the strong candidates: the best at temperature 0, else sampled.

    Sampling is a softmax over the strong candidates only, so sentences that score close to
    each other split the samples, and a sentence well below the best never joins an answer.
    """
    pool = strong_candidates(scored)
    chosen: list[ScoredSentence] = []
    while pool and len(chosen) < max_sentences:
        pick = _softmax_pick(rng, pool, temperature)
        chosen.append(pick)
        pool = [c for c in pool if c is not pick]
    return sorted(chosen, key=lambda c: (-c.score, c.order))


def _ends_chinese(sentence: str) -> bool:
    return bool(sentence) and (sentence[-1] in "。！？；…" or bool(_CJK_RE.match(sentence[-1])))


def format_answer(chosen: Sequence[ScoredSentence], question: str, *, cite: bool = True) -> str:
    """The chosen sentences, verbatim, each followed by its citation (unless ``cite`` is False).

    English: ``"Sentence. [M01]"``; Chinese: ``"句子。[M01]"``.
    """
    if not chosen:
        return CANNOT_ANSWER_ZH if _is_chinese(question) else CANNOT_ANSWER_EN
    out = ""
    previous_chinese = False
    for c in chosen:
        chinese = _ends_chinese(c.sentence)
        if out and not (previous_chinese and _is_chinese(c.sentence)):
            out += " "
        if not cite:
            out += c.sentence
        elif chinese:
            out += f"{c.sentence}[{c.material_id}]"
        else:
            out += f"{c.sentence} [{c.material_id}]"
        previous_chinese = chinese
    return out


def _facts(sentence: str) -> list[str]:
    """Clause numbers and quantities of a sentence, as written, in order; nested ones dropped."""
    spans = [(m.start(), m.end(), m.group(0)) for m in _CLAUSE_RE.finditer(sentence)]
    spans += [(q.start, q.end, q.raw) for q in extract_quantities(sentence)]
    kept = [
        (start, end, raw)
        for start, end, raw in spans
        if not any((s2 <= start and end <= e2) and (e2 - s2) > (end - start) for s2, e2, _ in spans)
    ]
    return [raw.strip() for _, _, raw in sorted(kept) if raw.strip()]


def make_plan(chosen: Sequence[ScoredSentence]) -> dict[str, list[str]]:
    """The plan for the chosen sentences: their material ids and the facts they state."""
    ids: list[str] = []
    facts: list[str] = []
    for c in chosen:
        if c.material_id not in ids:
            ids.append(c.material_id)
        for fact in _facts(c.sentence):
            if fact not in facts:
                facts.append(fact)
    return {"material_ids": ids, "key_facts": facts}


class ExtractiveChatModel(ReplyChatModel):
    """An extractive answerer with a chat-model interface; not a language model.

    It answers only from the ``<material>`` blocks in its prompt (see ``tracerag.prompts``),
    with up to ``max_sentences`` sentences copied verbatim from them, each followed by its
    citation, e.g. ``"Laptops are covered for 24 months. [warranty]"``. Sentences are ranked
    by the IDF-weighted share of the question's content terms they contain. At temperature 0
    the best sentences are taken; above 0 they are sampled from a softmax over the sentences
    scoring within 80% of the best, so close candidates split the samples and a clearly
    dominant sentence is always chosen. When no sentence is relevant enough it says it cannot
    answer, in the question's language.

    Tasks: ``answer`` (restricted to the materials of a ``<plan>`` when one is given);
    ``plan``, a JSON plan naming the materials of every sentence close to the best one, with
    the amounts, dates and clauses they state (not sampled: a plan keeps competing materials
    in play); and ``plan_and_answer``, ``PLAN: {json}`` for the sentences actually chosen,
    then ``ANSWER: …``. Prompts without material blocks are read as foreign RAG prompts:
    blank-line-separated paragraphs of the context are materials cited by position, ``[1]``,
    ``[2]``, ….

    In an agent (``create_agent``, a LangGraph ``ToolNode``), ``bind_tools`` works: bound to
    tools and not yet given a tool result for the user's last message, it calls the first tool
    with that message as its first argument; given tool results, it answers from them. Each
    blank-line-separated passage of a tool result is a material, cited by the ``id`` of a
    ``Source: {metadata}`` line when the passage has one (the format of LangChain's RAG agent
    tutorial), else by its position.

    Calls draw from ``random.Random`` seeded with (``seed``, call number): with a seed, a run
    of calls is reproducible; without one, every call differs.

    In tracerag's prompt format it cites only when the prompt asks for citations (its system
    message or instruction mentions citing); foreign prompts are always cited by position, so
    ``wrap()`` can verify them.

    ``usage_metadata`` counts exactly the text it read (every message of the prompt) and wrote
    (the reply). It has no tokenizer of its own: its token is the unit of
    ``tracerag.usage.estimate_tokens`` (one per CJK character, one per started four-character
    chunk of other text).
    """

    model_name: str = "tracerag-extractive-1"
    temperature: float = 0.7
    max_sentences: int = 2
    seed: int | None = None
    #: answers to each prompt per call, as the OpenAI-compatible ``n`` (a call's ``n=``
    #: overrides it): the prompt is read, and its tokens counted, once for all of them
    n: int = 1

    _counter: CallCounter = PrivateAttr(default_factory=CallCounter)

    @property
    def _llm_type(self) -> str:
        return "tracerag-extractive"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "temperature": self.temperature,
            "max_sentences": self.max_sentences,
            "seed": self.seed,
        }

    def _rng(self) -> random.Random:
        call = self._counter.next()
        base = secrets.token_hex(8) if self.seed is None else str(self.seed)
        return random.Random(f"{base}:{call}")

    def respond(self, messages: Sequence[BaseMessage], temperature: float | None = None) -> str:
        """The text this model replies to ``messages`` with."""
        temp = self.temperature if temperature is None else float(temperature)
        parsed = parse_prompt(messages)
        rng = self._rng()
        materials = parsed.materials
        if parsed.plan_ids:
            planned = [m for m in materials if m.id in set(parsed.plan_ids)]
            materials = planned or materials
        scored = score_sentences(parsed.question, materials)
        if parsed.task == TASK_PLAN:
            # A plan names everything worth relying on, so it does not settle an ambiguity
            # that the answers themselves would disagree about.
            return json.dumps(make_plan(strong_candidates(scored)), ensure_ascii=False)
        chosen = select_sentences(scored, max(1, self.max_sentences), temp, rng)
        cite = parsed.foreign or asks_for_citations(messages)
        answer = format_answer(chosen, parsed.question, cite=cite)
        if parsed.task == TASK_PLAN_AND_ANSWER:
            plan = json.dumps(make_plan(chosen), ensure_ascii=False)
            return f"PLAN: {plan}\nANSWER: {answer}"
        return answer

    def _result(
        self, messages: Sequence[BaseMessage], texts: Sequence[str], temperature: float
    ) -> ChatResult:
        # one prompt read once, however many answers: the usage an OpenAI-compatible server
        # reports for ``n`` choices, on each of them
        input_tokens = sum(estimate_tokens(_message_text(m)) for m in messages)
        output_tokens = sum(estimate_tokens(text) for text in texts)
        usage = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        generations = [
            ChatGeneration(
                message=AIMessage(
                    content=text,
                    usage_metadata=dict(usage),
                    response_metadata={
                        "model_name": self.model_name,
                        "temperature": temperature,
                        "finish_reason": "stop",
                    },
                )
            )
            for text in texts
        ]
        return ChatResult(
            generations=generations,
            llm_output={"model_name": self.model_name, "token_usage": usage},
        )

    def bind_tools(
        self,
        tools: Sequence[Any],
        *,
        tool_choice: str | dict[str, Any] | bool | None = None,
        **kwargs: Any,
    ) -> Runnable[Any, AIMessage]:
        """The model with the tools' schemas bound, so an agent can give it tools."""
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _tool_call(self, messages: list[BaseMessage], tools: Sequence[Any]) -> ChatResult | None:
        """A call to the first tool with the user's last message, if no tool has answered it."""
        last_human = max(
            (i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=None
        )
        if not tools or last_human is None:
            return None
        if any(isinstance(m, ToolMessage) for m in messages[last_human + 1 :]):
            return None
        function = tools[0].get("function", {})
        first = next(iter((function.get("parameters") or {}).get("properties") or {"query": 0}))
        call = ToolCall(
            name=function.get("name", ""),
            args={first: _message_text(messages[last_human])},
            id=f"call_{self._counter.next()}",
            type="tool_call",
        )
        message = AIMessage(
            content="", tool_calls=[call], response_metadata={"model_name": self.model_name}
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _reply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        called = self._tool_call(messages, kwargs.get("tools") or ())
        if called is not None:
            return called
        temperature = float(kwargs.get("temperature", self.temperature))
        n = kwargs.get("n") or self.n
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InputTypeError(f"n must be a positive int, got {n!r}")
        texts = [self.respond(messages, temperature) for _ in range(n)]
        return self._result(messages, texts, temperature)

    async def _areply(self, messages: list[BaseMessage], **kwargs: Any) -> ChatResult:
        return self._reply(messages, **kwargs)  # cheap: answered on the loop, in call order
