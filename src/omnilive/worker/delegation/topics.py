"""What a delegation cue also covers: the words people use for its topic,
and the words Whisper hears in their place.

A session says "delegate weather forecasts"; its user asks "will it rain?"
or "is it going to be sunny?". Neither shares a word with the cue, so the
cue judge widens each cue by its topic's family: when any word of a family
below is among a session's cues, the whole family is. A family joins only
through the session's own instructions or tools, so a session that
delegates nothing of the weather never delegates "is it sunny?".

Whisper (int8 on a CPU, synthetic or noisy voices) also hears a short cue
word as a longer one that sounds alike, a consonant smeared onto its
onset: "rain" as "train". :func:`sounds_like` lets a heard word that is a
cue word of four letters or more with one letter in front count. It is no
wider than that: one letter off anywhere would take "whether" for
"weather" and "shock" for "stock", words people say to the model itself.
The price is a real word of that shape ("brain" for "rain"), delegated
only in a session whose cues have the shorter word.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

# One family a line: a topic's words as people say them in a request.
FAMILIES = """
weather forecast rain raining rainy sunny sun sunshine snow snowing cloudy clouds wind windy
    storm stormy temperature degrees hot cold warm chilly umbrella humid humidity fog foggy
    frost thunder hail heatwave celsius fahrenheit
book booking reserve reservation reservations table restaurant seat seats
flight flights plane airline airport landing depart departure arrive arrival gate delayed
    delay boarding takeoff
stock stocks share shares price market trading nasdaq ticker invest investment portfolio
calendar meeting appointment schedule agenda reminder remind
email emails mail inbox message messages
news headline headlines
order orders delivery package parcel shipping shipment tracking
traffic route directions commute drive driving
balance account bank payment transfer
""".strip()

_MIN_ONSET = 4  # a cue word this long may be heard with one letter in front of it


def families(stem: Callable[[str], str]) -> list[frozenset[str]]:
    """The families of :data:`FAMILIES`, each word stemmed with ``stem``."""
    return [
        frozenset(stem(word) for word in line.split())
        for line in FAMILIES.replace("\n    ", " ").splitlines()
    ]


def widened(cues: set[str], topic_families: Iterable[frozenset[str]]) -> set[str]:
    """``cues`` with every family that has a word among them."""
    found = set(cues)
    for family in topic_families:
        if family & cues:
            found |= family
    return found


def sounds_like(heard: str, cue: str) -> bool:
    """Whether ``heard`` may be Whisper's hearing of ``cue`` (module docstring)."""
    if heard == cue:
        return True
    return len(cue) >= _MIN_ONSET and len(heard) == len(cue) + 1 and heard[1:] == cue
