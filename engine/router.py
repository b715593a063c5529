"""Picks a preset (code / qa / creative) for a message when the preset mode is "auto", and says why.

Pure keyword and regex scoring: deterministic, no model, well under a millisecond for a chat message.

How a decision is made:
- Each cue (a code fence, a language name, "rhyme" ...) adds its weight once to its class's evidence
  (vocabulary lists: once per different word, at most twice). Evidence is capped at `EVIDENCE_CAP`, so a
  long paste cannot outvote an explicit request.
- An explicit request ("write a poem ...", "write a function ...", "fix this bug") adds a large bonus:
  what the user asks for beats what the message talks about ("write a poem about Python" is creative,
  "write a function that returns a poem" is code).
- code or creative wins when its score reaches `DECISION_THRESHOLD`; otherwise qa, the general default
  for questions, explanations, facts and advice.

Documented choice: a single programming term (or a file format such as CSV) with no code, language name or
second programming cue is not enough for code. "explain what a closure is" goes to qa (prose explanation, and
"closure" is also an everyday word); "explain closures in JavaScript" or a message with a snippet goes to code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

ROUTED_PRESETS = ("code", "qa", "creative")
DECISION_THRESHOLD = 2.0
EVIDENCE_CAP = 6.0
REQUEST_BONUS = 6.0
# Very long pastes are code-like or not within their first screenfuls; scanning all of them only costs time.
SCAN_LIMIT = 20_000


@dataclass(frozen=True, slots=True)
class RouteDecision:
    preset: str
    reason: str
    scores: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Cue:
    """One piece of evidence: a pattern, its weight, and how the reason names it.

    `label` may contain `{match}` (the matched text) or `{lower}` (the same, lower-cased); creative
    requests also `{form}` (the poem, story ... asked for).
    """

    label: str
    weight: float
    pattern: re.Pattern[str]
    # Vocabulary lists count each different word, up to this many: two programming words are better
    # evidence than one, but a paste full of them should not outvote everything else.
    max_hits: int = 1


def _cue(label: str, weight: float, pattern: str, flags: int = re.IGNORECASE, max_hits: int = 1) -> Cue:
    return Cue(label, weight, re.compile(pattern, flags), max_hits)


# Between a request verb and its object: a few describing words, but no preposition or relative pronoun
# that would show the object belongs to something else ("write tests for the story model").
_DESCRIBING_WORDS = r"(?:\s+(?!(?:for|to|of|in|on|with|from|which|who|about)\b)[\w'-]+){0,4}?"

# ------------------------------------------------------------------------------------------------ code

_FILE_EXTENSIONS = (
    "py|pyi|ipynb|rs|go|c|h|cc|cpp|hpp|cxx|cs|java|kt|kts|scala|swift|m|mm|rb|php|pl|lua|r|jl|dart|zig|"
    "ex|exs|erl|hs|ml|clj|js|mjs|cjs|jsx|ts|tsx|vue|svelte|html?|css|scss|sass|less|sh|bash|zsh|fish|ps1|"
    "bat|sql|json|jsonl|ya?ml|toml|ini|cfg|conf|xml|csv|lock|gradle|cmake|mk|proto|graphql|tf|env|log"
)

CODE_CUES: tuple[Cue, ...] = (
    # Structure: pasted code, stack traces, compiler and runtime errors.
    _cue("code fence", 4.0, r"```|~~~"),
    _cue("a stack trace", 3.0, r"Traceback \(most recent call last\)|^\s*File \"[^\"]+\", line \d+", re.M),
    _cue("a stack trace", 3.0, r"^\s*at [\w.$<>]+\([\w.]+:\d+\)|panicked at|Exception in thread", re.M),
    _cue(
        "a compiler error",
        3.0,
        r"error\[E\d{3,4}\]|error: expected|undefined reference to|cannot find symbol",
    ),
    _cue("error name '{match}'", 2.5, r"\b[A-Z][A-Za-z]*(?:Error|Exception)\b", 0),
    _cue(
        "error message",
        2.0,
        r"is not (?:a function|defined|subscriptable|iterable|callable)|unexpected token|syntax ?error|"
        r"segmentation fault|core dumped|null pointer|stack overflow|out of bounds|command not found",
    ),
    _cue("error code '{match}'", 1.5, r"\bE[A-Z]{3,}\b|\berrno\b|\bexit (?:code|status) \d+", 0),
    _cue("inline code", 1.5, r"`[^`\n]+`"),
    _cue(
        "file name '{match}'",
        2.0,
        r"\b[\w./-]*\w\.(?:" + _FILE_EXTENSIONS + r")\b(?![\w-])|\b(?:Dockerfile|Makefile|CMakeLists\.txt)\b",
    ),
    _cue("a file path", 1.0, r"(?:^|\s)(?:~|\.{1,2})?/(?:[\w.-]+/)+[\w.-]*"),
    # Syntax that prose does not have.
    _cue(
        "code syntax",
        2.0,
        r"\b(?:def|fn|func|function)\s+\w+\s*\(|\bclass\s+\w+\s*[:({]|#include\s*<|\bimport\s+[\w.]+\s*;|"
        r"\bfrom\s+[\w.]+\s+import\b|\b(?:const|let|var)\s+\w+\s*=|\b(?:SELECT|INSERT|UPDATE|DELETE)\b.+"
        r"\b(?:FROM|INTO|SET|WHERE)\b|\bfor\s+\w+(?:,\s*\w+)?\s+in\s+[\w.*]+\s*[:;]|^\s*(?:return|print)\b.*$",
        re.M,
    ),
    _cue("a function call", 1.5, r"\b[A-Za-z_][\w.]*\w\([^()\n]{0,80}\)"),
    _cue("an operator", 2.0, r"==|!=|&&|\|\||::|\+=|-=|=>|->|\w\[\w*\]"),
    # Also written in maths and prose ("if x >= 3"), so weaker.
    _cue("a comparison operator", 1.0, r"<=|>="),
    _cue(
        "identifier '{match}'", 1.0, r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b|\b[a-z]{2,}(?:[A-Z][a-z0-9]+)+\b", 0
    ),
    _cue("a method call", 1.0, r"\b[a-z_]\w*\.[a-z_]\w*\b(?!\.)(?=\s|\(|$|[,;)])", 0),
    _cue(
        "shell command '{match}'",
        2.0,
        r"^\s*\$\s+\S+|\b(?:git|pip3?|npm|npx|yarn|pnpm|cargo|rustup|docker|kubectl|helm|ssh|scp|grep|sed|awk|curl|"
        r"wget|chmod|chown|sudo|apt(?:-get)?|brew|conda|poetry|uv|go|gcc|clang|cmake|make|gdb|valgrind|"
        r"ffmpeg|systemctl|journalctl|tar|rsync)\s+(?:-{1,2}\w|install|build|run|add|init|commit|push|pull|"
        r"rebase|merge|status|clone|checkout|log|test|exec|compose|apply|get|update|upgrade|--)",
        re.M,
    ),
    # Languages, runtimes and tools. Words that are also everyday English ("rust", "go", "swift") only
    # count capitalised, and Go only after "in"/"with"/"using".
    _cue(
        "{match}",
        2.0,
        r"\b(?:python|javascript|typescript|kotlin|haskell|golang|c\+\+(?!\w)|c#(?!\w)|php|perl|bash|powershell|"
        r"sql|postgres(?:ql)?|mysql|sqlite|mongodb|redis|html|css|json|yaml|node\.?js|npm|django|flask|"
        r"fastapi|pandas|numpy|pytorch|tensorflow|kubernetes|docker|linux|webpack|graphql|pytest|jest|"
        r"git|github|gitlab|vim|emacs|vs ?code|jupyter|regex|regexp)(?!\w)(?<!monty python)",
    ),
    _cue(
        "{match}",
        1.0,
        r"\b(?:Rust|Ruby|Swift|Java|Scala|Elixir|React|Vue|Angular|Express|Rails|Spring)\b|\bC(?![+#\w])",
        0,
    ),
    _cue("Go", 1.5, r"\b(?:in|with|using|for) Go\b", 0),
    # Programming vocabulary: unambiguous terms weigh 2, words with everyday meanings weigh 1.
    _cue(
        '"{lower}"',
        2.0,
        r"\b(?:traceback|stack ?trace|segfault|refactor\w*|compil(?:e|er|es|ed|ing|ation)|regex\w*|"
        r"APIs?|SDK|endpoints?|unit ?tests?|integration tests?|debugg(?:er|ing)|linked list|hash ?map|"
        r"binary tree|recursion|recursive|big[- ]o|time complexity|algorithm\w*|ORM|async|await|mutex|"
        r"deadlock|race condition|null|undefined|boolean|integer|int|float|enum|struct|pointer|"
        r"dereferenc\w*|memory leak|garbage collect\w*|dependency injection|type hints?|generics?|lambda|"
        r"callbacks?|promises?|closures? in|source code|codebase|repo(?:sitory)?|pull request|"
        r"merge conflict|commit|frontend|backend|localhost|CLI|HTTP|REST|JSON|dict(?:ionary)? "
        r"comprehension|list comprehension|dataframe|component|hook|useEffect|namespace|module|"
        r"library|framework|package manager|virtualenv|venv|IDE|linter|idiomatic|"
        r"(?:for|while|infinite|nested|event) ?-?loops?|if statements?|switch statements?|try[/-](?:except|catch)|"
        r"div|flexbox|DOM|iframe|navbar|tailwind|bootstrap|stdout|stderr|stdin)\b",
        max_hits=2,
    ),
    _cue(
        '"{lower}"',
        1.0,
        r"\b(?:code|coding|coder|function|method|class|variable|bug|debug|error|errors|exception|crash\w*|"
        r"script|program|programming|query|queries|database|server|client|deploy\w*|build|install|"
        r"loop|array|string|list|dict|tuple|object|thread|process|memory|cache|parse|parser|"
        r"syntax|compile|runtime|closure|stack|heap|index|branch|merge|terminal|console|command line|"
        r"implement\w*|mock\w*|snippet|image|container|app|website|webpage|browser|CPU|GPU|"
        r"lookups?|iterat\w+|indices|key-value|encrypt\w*|authenticat\w*|hash(?:ing|ed)?|JWT|OAuth|SSL|TLS|"
        # A spreadsheet's file format as much as a programmer's: alone it does not make a question code.
        r"CSV)\b",
        max_hits=2,
    ),
)

# An explicit request for code: a code verb followed (within a few words) by a code noun.
CODE_REQUESTS: tuple[Cue, ...] = (
    _cue(
        "asks to {lower}",
        REQUEST_BONUS,
        r"\b(?:write|implement|create|generate|give me|show me|add|fix|debug|refactor|optimi[sz]e|"
        r"convert|port|translate|rewrite|review|test)\b" + _DESCRIBING_WORDS + r"\s+"
        r"(?:functions?|scripts?|programs?|class(?:es)?|methods?|"
        r"unit tests?|tests|quer(?:y|ies)|regex(?:es)?|code|snippets?|endpoints?|modules?|"
        r"loops?|bug|Dockerfile|makefile|CLI|API|SQL|algorithm)\b",
    ),
)

# --------------------------------------------------------------------------------------------- creative

_CREATIVE_FORMS = (
    r"poems?|poetry|stor(?:y|ies)|tales?|haikus?|songs?|lyrics|limericks?|sonnets?|ballads?|raps?|verses?|"
    r"fables?|fairy ?tales?|novels?|novellas?|screenplays?|monologues?|dialogues?|scenes?|odes?|elegy|"
    r"fan ?fic(?:tion)?|jokes?|riddles?|toasts?|jingles?|acrostics?|parod(?:y|ies)|slogans?|taglines?|"
    r"myths?|legends?|chapters?|plot|plot twists?|characters?|villanelles?|couplets?|love letters?|vows|"
    r"eulog(?:y|ies)|epitaphs?|serenades?|speech(?:es)?|pick-?up lines?|one-liners?"
)

CREATIVE_REQUESTS: tuple[Cue, ...] = (
    _cue(
        "asks for {form}",
        REQUEST_BONUS,
        r"\b(?:write|compose|pen|craft|create|make up|invent|tell|give|come up with|generate|draft|spin|"
        r"dream up|sing|recite|improvise)(?:\s+(?:me|us|him|her|them))?" + _DESCRIBING_WORDS + r"\s+"
        r"(?P<form>" + _CREATIVE_FORMS + r")\b",
    ),
    _cue("asks for {form}", REQUEST_BONUS, r"\b(?P<form>" + _CREATIVE_FORMS + r"),? please\b"),
)

CREATIVE_CUES: tuple[Cue, ...] = (
    _cue('"once upon a time"', 3.0, r"\bonce upon a time\b"),
    _cue(
        "names a subject",
        2.5,
        r"\b(?:poem|haiku|limerick|sonnet|ode|ballad|lyrics|story|fable)s? (?:about|for|that|where)\b",
    ),
    _cue('mentions "{lower}"', 1.5, r"\b(?:" + _CREATIVE_FORMS + r")\b"),
    _cue("imagines a scene", 2.5, r"\bimagine (?:a|an|the|that|if|you|being)\b(?![^.?!]*\bshould\b)"),
    _cue('"imagine"', 1.0, r"\bimagin\w*\b"),
    _cue("asks to invent something", 2.0, r"\b(?:invent|make up|dream up|come up with)\b"),
    _cue(
        "role-play",
        2.0,
        r"\bpretend (?:you|to be|that)|\brole[- ]?play\w*|\bact as (?:a|an) \w+ (?:and|who)\b|"
        r"\bas (?:if|though) you were\b|\bin the voice of\b|\bfrom the (?:perspective|point of view) of (?:a|an|the)\b",
    ),
    _cue(
        '"{lower}"', 2.0, r"\b(?:fiction(?:al)?|rhym\w*|stanzas?|free verse|brainstorm\w*|catchy|whimsical)\b"
    ),
    _cue(
        "asks for names or ideas",
        2.0,
        r"\b(?:names|slogans|taglines|titles|puns|nicknames|mottos?)\s+(?:for|about)\b|"
        r"\bideas for (?:a|an|my)\b|\bwhat if\b",
    ),
    _cue(
        "asks for a style",
        2.0,
        r"\bin the style of\b|\bin (?:a |an )?(?:noir|gothic|shakespearean|epic|fairy-tale) style\b|"
        r"\b(?:to )?sound(?:s)? like (?:a |an )?[A-Z]\w+|\bas if written by\b",
    ),
    _cue(
        '"{lower}"',
        1.0,
        r"\b(?:sci-?fi|fantasy|mystery|noir|horror|romance|bedtime|protagonist|villain|hero(?:ine)?|dragons?|"
        r"wizards?|knights?|unicorns?|mermaids?|pirates?|spaceships?|narrat\w+|"
        r"funny|puns?|creative|continue|vivid\w*|evocative|aliens?|robots?|ghosts?|monsters?|time travel\w*|"
        r"describe an?)\b",
        max_hits=2,
    ),
)

# ---------------------------------------------------------------------------------------------- qa kinds

_QA_KINDS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("comparison", re.compile(r"\bdifference between\b|\bcompare\b|\bvs\.?\b|\bversus\b|\bbetter\b", re.I)),
    (
        "explanation request",
        re.compile(r"^\s*(?:explain|describe|tell me about)\b|\bhow does\b|\bwhy\b", re.I),
    ),
    ("summary request", re.compile(r"\bsummari[sz]e\b|\btl;?dr\b|\bin a few sentences\b", re.I)),
    (
        "advice request",
        re.compile(
            r"\bshould I\b|\btips?\b|\badvice\b|\brecommend\w*\b|\bhow (?:do|can) I\b|\bbest way\b", re.I
        ),
    ),
    (
        "question",
        re.compile(
            r"\?\s*$|^\s*(?:what|who|whom|when|where|which|why|how|is|are|can|could|do|does|did|will|would|"
            r"should|was|were)\b",
            re.I | re.M,
        ),
    ),
)


def _label(cue: Cue, match: re.Match[str]) -> str:
    text = " ".join(match.group(0).split()).strip(" .,:;$")[:40]
    values = {"match": text, "lower": text.lower()}
    if "form" in match.re.groupindex and match.group("form"):
        form = match.group("form").lower()
        article = "an" if form[0] in "aeiou" else "a"
        values["form"] = f"{article} {form}" if not form.endswith("s") or form in ("lyrics",) else form
    return cue.label.format(**values)


def _score(text: str, cues: Iterable[Cue]) -> tuple[float, list[tuple[float, str]]]:
    """Sum of the weights of the cues found (each cue once), and the evidence found, strongest first."""
    total = 0.0
    evidence: list[tuple[float, str]] = []
    for cue in cues:
        if cue.max_hits == 1:
            match = cue.pattern.search(text)
            matches = [match] if match is not None else []
        else:
            distinct: dict[str, re.Match[str]] = {}
            for match in cue.pattern.finditer(text):
                distinct.setdefault(match.group(0).lower(), match)
                if len(distinct) == cue.max_hits:
                    break
            matches = list(distinct.values())
        for match in matches:
            total += cue.weight
            evidence.append((cue.weight, _label(cue, match)))
    evidence.sort(key=lambda item: -item[0])
    return total, evidence


def _first_request(text: str, cues: Iterable[Cue]) -> tuple[int, str] | None:
    """Position and label of the earliest explicit request among `cues`, if any."""
    found = [(m.start(), _label(c, m)) for c in cues if (m := c.pattern.search(text)) is not None]
    return min(found) if found else None


def _qa_kind(text: str) -> str:
    for kind, pattern in _QA_KINDS:
        if pattern.search(text):
            return kind
    return "statement"


# Words of cue labels that say what kind of cue it is, not what was found.
_GENERIC_LABEL_WORDS = frozenset(
    ["a", "an", "and", "name", "file", "error", "shell", "command", "identifier", "code", "mentions"]
)


def _join_evidence(evidence: list[tuple[float, str]], limit: int = 2) -> str:
    """The strongest `limit` pieces of evidence; two labels naming the same words count once."""
    names: list[str] = []
    seen: set[str] = set()
    for _, name in evidence:
        words = set(re.findall(r"[a-z0-9+#]+", name.lower()))
        if not words & seen:
            names.append(name)
        seen |= words - _GENERIC_LABEL_WORDS
    return " and ".join(names[:limit])


# ------------------------------------------------------------------------------------------- follow-ups

# A message that points back at what the conversation was about: "that function", "the code above", "show it
# again", "make it rhyme". Such a message keeps the conversation's preset unless it asks for something else.
_THING = (
    r"function|method|class|code|script|snippet|program|query|regex|test|tests|module|file|loop|example|"
    r"implementation|version|one|poem|story|verse|verses|stanza|song|lyrics|haiku|limerick|tale|chapter|scene|"
    r"answer|reply|text|list|table|line|lines|part|bit"
)
_FOLLOW_UP = re.compile(
    rf"\b(?:that|this|your|these|those|same|previous|last|above|earlier)\s+(?:{_THING})\b"
    r"|\b(?:above|again|instead)\b"
    r"|^\s*(?:now|also|and|then|ok(?:ay)?|great|thanks|next|but|what about|how about|can you(?: also| now)?|"
    r"could you(?: also| now)?|please)\b[^.?!]{0,80}\b(?:it|them|that|this)\b",
    re.IGNORECASE,
)
# How far back the conversation counts: the last few turns (a follow-up refers to what was just said).
RECENT_TURNS = 4


def _follow_up(text: str) -> str | None:
    """The words that make `text` refer back to the conversation ("that function"), if any."""
    match = _FOLLOW_UP.search(text)
    return " ".join(match.group(0).split())[:40] if match is not None else None


def conversation_preset(recent: Sequence[tuple[str, str]], choices: Sequence[str]) -> str | None:
    """What the recent turns ((role, text), oldest first) were about: code where a turn holds code or the last
    user message routed to code on its own, creative likewise; None for qa or nothing."""
    turns = list(recent)[-RECENT_TURNS:]
    for role, content in reversed(turns):
        if role == "user":
            decided = route(content, choices)
            if decided.preset in ("code", "creative"):
                return decided.preset
            return None
        if role == "assistant" and "code" in choices and re.search(r"```|~~~", content):
            return "code"
    return None


def route(
    text: str, available: Iterable[str] = ROUTED_PRESETS, recent: Sequence[tuple[str, str]] = ()
) -> RouteDecision:
    """Choose code / qa / creative for `text` (restricted to `available`), with a short reason and the scores.

    `recent`: the conversation's last turns as (role, text), oldest first. A message that would go to qa on its
    own but refers back to them ("show that function again") stays with what they were about."""
    decision = _route_alone(text, available)
    if not recent or decision.preset != _fallback("qa", [n for n in available if n in ROUTED_PRESETS]):
        return decision
    reference = _follow_up(text[:SCAN_LIMIT])
    if reference is None:
        return decision
    choices = [name for name in available if name in ROUTED_PRESETS]
    topic = conversation_preset(recent, choices)
    if topic is None or topic == decision.preset:
        return decision
    what = "the code" if topic == "code" else "the creative piece"
    return RouteDecision(topic, f'a follow-up on {what} above ("{reference}")', decision.scores)


def _route_alone(text: str, available: Iterable[str] = ROUTED_PRESETS) -> RouteDecision:
    """The decision from the message alone."""
    choices = [name for name in available if name in ROUTED_PRESETS]
    if not choices:
        raise ValueError("route: none of code, qa, creative is available")
    sample = text[:SCAN_LIMIT]
    if not sample.strip():
        return RouteDecision(_fallback("qa", choices), "empty message", dict.fromkeys(ROUTED_PRESETS, 0.0))

    code_raw, code_evidence = _score(sample, CODE_CUES)
    creative_raw, creative_evidence = _score(sample, CREATIVE_CUES)
    code_request = _first_request(sample, CODE_REQUESTS)
    creative_request = _first_request(sample, CREATIVE_REQUESTS)
    # Both kinds of request ("write a poem, then a function that prints it"): the first one asked decides.
    if code_request and creative_request:
        if code_request[0] <= creative_request[0]:
            creative_request = None
        else:
            code_request = None

    scores = {
        "code": min(code_raw, EVIDENCE_CAP) + (REQUEST_BONUS if code_request else 0.0),
        "qa": DECISION_THRESHOLD,
        "creative": min(creative_raw, EVIDENCE_CAP) + (REQUEST_BONUS if creative_request else 0.0),
    }
    scores = {name: round(value, 2) for name, value in scores.items()}

    ranked = sorted(
        (name for name in ("code", "creative") if name in choices and scores[name] >= DECISION_THRESHOLD),
        key=lambda name: -scores[name],
    )
    if ranked:
        winner = ranked[0]
        request = code_request if winner == "code" else creative_request
        # An explicit request says it all ("asks for a poem"); otherwise name the two strongest cues.
        if request is not None:
            reason = request[1]
        else:
            reason = _join_evidence(code_evidence if winner == "code" else creative_evidence)
        return RouteDecision(winner, reason, scores)

    kind = _qa_kind(sample)
    weak = code_evidence if code_raw >= creative_raw else creative_evidence
    if weak:
        which = "code" if code_raw >= creative_raw else "creative"
        reason = f"only a weak {which} cue ({_join_evidence(weak, 1)}): {kind}"
    else:
        reason = f"no code or creative cues: {kind}"
    chosen = _fallback("qa", choices)
    if chosen != "qa":
        reason += f" (qa not available, using {chosen})"
    return RouteDecision(chosen, reason, scores)


def _fallback(wanted: str, choices: list[str]) -> str:
    return wanted if wanted in choices else choices[0]
