"""Word tokens for Chinese and English text: stemmed English words, numbers, Chinese bigrams."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

from tracerag.text._sentences import CITATION_MARKER_RE

__all__ = [
    "CHINESE_STOPWORDS",
    "ENGLISH_STOPWORDS",
    "Token",
    "content_terms",
    "is_stopword",
    "stem",
    "token_set",
    "tokenize",
    "tokenize_spans",
]

_CJK = r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN_RE = re.compile(
    rf"(?P<num>\d+(?:[.,]\d+)*)"
    rf"|(?P<word>[A-Za-z]+(?:['’][A-Za-z]+)*)"
    rf"|(?P<cjk>[{_CJK}]+)"
)
_THOUSANDS_RE = re.compile(r"^\d{1,3}(?:,\d{3})+(?:\.\d+)?$")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


ENGLISH_STOPWORDS: frozenset[str] = _words(
    """
    a about above after again against all also am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each either else ever every few for from further had hadn't
    has hasn't have haven't having he he'd he'll he's her here here's hers herself him himself his
    how how's however i i'd i'll i'm i've if in into is isn't it it's its itself just let's may
    me might more most must mustn't my myself neither no nor not now of off on once only or other
    ought our ours ourselves out over own per please same shall shan't she she'd she'll she's
    should shouldn't so some such than that that's the their theirs them themselves then there
    there's these they they'd they'll they're they've this those through thus to too under until
    up upon very via was wasn't we we'd we'll we're we've were weren't what what's when when's
    where where's whether which while who who's whom whose why why's will with within without
    won't would wouldn't yet you you'd you'll you're you've your yours yourself yourselves
    one also its it's s t
    """
)

CHINESE_STOPWORDS: frozenset[str] = _words(
    """
    的 了 是 在 和 与 及 或 也 都 就 而 且 这 那 我 你 他 她 它 您 们 吗 呢 吧 啊 呀 嘛 哦 么 之 其
    把 被 对 于 为 以 将 从 向 由 给 让 得 地 着 过 个 些 又 还 再 很 更 最 等 如 若 则 即 该 此 每
    我们 你们 他们 她们 它们 您的 我的 你的 这个 那个 这些 那些 这样 那样 这里 那里 可以 如果
    因为 所以 但是 不过 而且 并且 已经 就是 还是 以及 或者 什么 怎么 怎样 如何 为什 么时 哪些
    一个 一些 一下 进行 可能 需要 应该 只是 只有 其中 之后 之前 之一 以上 以下 通过 由于 关于 对于
    根据 按照 有关 相关 是否 请问 您好 谢谢 的话 时候 方面 情况 问题 多少 哪个 哪里 为何
    """
)

# Characters that only glue words together: a bigram containing one carries no content.
_PARTICLES = frozenset("的了吗呢吧啊呀嘛哦着")


# Irregular English verb forms and their base form (stemmed like any other word afterwards).
_IRREGULAR_TEXT = """
took:take taken:take won:win began:begin begun:begin became:become came:come went:go gone:go
made:make gave:give given:give got:get gotten:get held:hold led:lead left:leave met:meet
paid:pay ran:run said:say saw:see seen:see sent:send sold:sell spent:spend stood:stand
told:tell thought:think wrote:write written:write built:build bought:buy brought:bring
chose:choose chosen:choose drew:draw drawn:draw fell:fall fallen:fall found:find grew:grow
grown:grow kept:keep knew:know known:know lost:lose rose:rise risen:rise sang:sing sung:sing
spoke:speak spoken:speak taught:teach threw:throw thrown:throw wore:wear worn:wear
fought:fight flew:fly flown:fly forgot:forget forgotten:forget meant:mean shot:shoot
struck:strike swam:swim ate:eat eaten:eat drove:drive driven:drive rode:ride ridden:ride
broke:break broken:break froze:freeze frozen:freeze stole:steal stolen:steal hid:hide
hidden:hide felt:feel heard:hear slept:sleep sought:seek dealt:deal taken:take
understood:understand withdrew:withdraw withdrawn:withdraw undertook:undertake
children:child men:man women:woman people:person feet:foot teeth:tooth mice:mouse
"""
_IRREGULAR = dict(pair.split(":") for pair in _IRREGULAR_TEXT.split())


class Token(NamedTuple):
    """One token and the ``[start, end)`` offsets of the text it was made from."""

    text: str
    start: int
    end: int


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light English stem: drops possessives, plural and common verb endings."""
    w = word.lower().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    w = _IRREGULAR.get(w, w)
    if "'" in w or len(w) <= 3:
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith(("sses", "shes", "ches", "xes", "zes")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    if w.endswith("ied") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("ing") and len(w) >= 6:
        w = w[:-3]
    elif (w.endswith("ed") and len(w) >= 5) or (w.endswith("ly") and len(w) >= 6):
        w = w[:-2]
    if len(w) >= 4 and w[-1] == w[-2] and w[-1] not in "aeiouls":
        w = w[:-1]  # stopped -> stop
    if len(w) >= 4 and w.endswith("e"):
        w = w[:-1]  # cite / cited / citing -> cit
    return w


def _number_token(raw: str) -> str:
    if _THOUSANDS_RE.match(raw):
        raw = raw.replace(",", "")
    if re.fullmatch(r"\d+\.\d+", raw):
        raw = raw.rstrip("0").rstrip(".")
    return raw


def tokenize_spans(text: str) -> list[Token]:
    """Tokens of ``text`` with the offsets of the text each one was made from."""
    return list(_spans(text))


@lru_cache(maxsize=4096)
def _spans(text: str) -> tuple[Token, ...]:
    """The tokens of one text, kept for the texts a request reads more than once (its claims,
    the retrieved materials)."""
    cleaned = CITATION_MARKER_RE.sub(lambda m: " " * len(m.group()), text)
    tokens: list[Token] = []
    for m in _TOKEN_RE.finditer(cleaned):
        if m.group("num") is not None:
            raw = m.group("num")
            # "1,2,3" lists: split unless it is a thousands number.
            if "," in raw and not _THOUSANDS_RE.match(raw):
                pos = m.start()
                for part in raw.split(","):
                    if part:
                        tokens.append(Token(_number_token(part), pos, pos + len(part)))
                    pos += len(part) + 1
            else:
                tokens.append(Token(_number_token(raw), m.start(), m.end()))
        elif m.group("word") is not None:
            word = m.group("word").lower().replace("’", "'")
            token = word if word in ENGLISH_STOPWORDS else stem(word)
            tokens.append(Token(token, m.start(), m.end()))
        else:
            run = m.group("cjk")
            if len(run) == 1:
                tokens.append(Token(run, m.start(), m.end()))
            else:
                for k in range(len(run) - 1):
                    tokens.append(Token(run[k : k + 2], m.start() + k, m.start() + k + 2))
    return tuple(tokens)


def tokenize(text: str) -> list[str]:
    """Tokens of ``text``, in order, repeats kept.

    English words are lowercased and lightly stemmed, numbers are single tokens (``1,200`` →
    ``1200``), Chinese is cut into overlapping character bigrams (a lone character is kept as
    is), and citation markers such as ``[M03]`` are dropped.
    """
    return [t.text for t in _spans(text)]


def token_set(text: str) -> frozenset[str]:
    """The distinct tokens of ``text``: ``frozenset(tokenize(text))``, without offsets."""
    out: set[str] = set()
    add = out.add
    for m in _TOKEN_RE.finditer(CITATION_MARKER_RE.sub(" ", text)):
        kind, raw = m.lastgroup, m.group()
        if kind == "word":
            word = raw.lower().replace("’", "'")
            add(word if word in ENGLISH_STOPWORDS else stem(word))
        elif kind == "num":
            if "," in raw and not _THOUSANDS_RE.match(raw):
                out.update(_number_token(part) for part in raw.split(",") if part)
            else:
                add(_number_token(raw))
        elif len(raw) == 1:
            add(raw)
        else:
            out.update(raw[k : k + 2] for k in range(len(raw) - 1))
    return frozenset(out)


def is_stopword(token: str) -> bool:
    """Whether ``token`` (as made by ``tokenize``) is a function word with no content."""
    if token in ENGLISH_STOPWORDS or token in CHINESE_STOPWORDS:
        return True
    if _CJK_RE.match(token):
        if len(token) == 2:
            return (token[0] in _PARTICLES or token[1] in _PARTICLES) or (
                token[0] in CHINESE_STOPWORDS and token[1] in CHINESE_STOPWORDS
            )
        return token in CHINESE_STOPWORDS
    return False


_CJK_RE = re.compile(rf"[{_CJK}]")


def content_terms(text: str) -> list[str]:
    """Like ``tokenize``, without English and Chinese stopwords."""
    return [t for t in tokenize(text) if not is_stopword(t)]
