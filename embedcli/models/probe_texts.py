"""The fixed probe set of the parity-guarded `auto` dtype: texts of 1 to ~500 tokens, varied in kind.

Changing these texts changes every cached decision's meaning: bump `PROBE_VERSION` with them.
"""

from __future__ import annotations

PROBE_VERSION = 1

_PARAGRAPHS = (
    "The central bank held interest rates at 4.5% on Thursday, citing slower wage growth and a fall in "
    "energy prices, but warned that services inflation remained stubbornly high and that a cut before the "
    "summer was far from certain.",
    "Shares in the chip maker rose 12% in early trading after it raised its full-year forecast, saying demand "
    "from data centres had more than offset a weak market for personal computers and phones.",
    "The film, shot over three winters in the Scottish Highlands, follows a retired ferryman who agrees to "
    "carry one last passenger across a loch that no longer appears on any map.",
    "Researchers found that the enzyme folds into its active shape only when two calcium ions are bound, which "
    "may explain why earlier crystal structures, solved without calcium, showed an inactive form.",
    "To reset the device, hold the power button for ten seconds until the light blinks amber, then release it "
    "and wait for the light to turn solid green before reconnecting the cable.",
    "Le conseil municipal a voté mardi soir la rénovation de la piscine, fermée depuis deux ans, pour un coût "
    "estimé à 3,2 millions d'euros, dont la moitié financée par la région.",
    "Der Zug nach München fällt heute wegen einer Signalstörung aus; Reisende werden gebeten, den Regionalexpress "
    "über Augsburg zu nutzen, der um 14:05 Uhr von Gleis 7 abfährt.",
    "England needed 12 runs from the final over, and after two dot balls the captain struck consecutive sixes "
    "over midwicket to seal a one-wicket win that levels the series at 1-1.",
)

PROBE_TEXTS: tuple[str, ...] = (
    "hello",
    "Bank",
    "?",
    "2024-03-31",
    "Markets rally as inflation cools",
    "How do I reset my password?",
    "Best budget laptop for students in 2025",
    "Spurs sign Danish midfielder on five-year deal",
    "the quick brown fox jumps over the lazy dog",
    "Why does ice float on water while most solids sink in their own liquid?",
    "def mean(xs): return sum(xs) / len(xs)  # empty lists raise ZeroDivisionError",
    "SELECT id, name FROM users WHERE created_at > now() - interval '7 days' ORDER BY name;",
    "東京の天気は明日、晴れのち曇りの予報です。",
    "Привет, как дела? Давно не виделись.",
    "¿Dónde está la estación de tren más cercana?",
    "ERROR 2024-05-01T12:00:03Z worker-7 timeout after 30000 ms (retry 3/5)",
    "   leading and trailing whitespace   ",
    "UPPER CASE HEADLINE: PRICES SOAR",
    "#ai #ml #embeddings thread 🧵 1/7",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
    *_PARAGRAPHS,
    " ".join(_PARAGRAPHS[:2]),
    " ".join(_PARAGRAPHS[2:5]),
    "\n\n".join(_PARAGRAPHS[:4]),
    " ".join(_PARAGRAPHS),
    " ".join(_PARAGRAPHS * 2),
    " ".join(_PARAGRAPHS[::-1] * 3),
)
"""34 texts: words, titles, questions, code, logs, four scripts, paragraphs, and articles cut at max length."""
