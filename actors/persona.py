"""The assistant's personality and its mood towards each person, and what they decide: whether
it sends a follow-on message after the person winds a topic down, and how soon.

A persona is a small TOML file (`--persona PATH`):

    name = "Aria"
    energy = 0.5     # 0 to 1: how readily and how soon it speaks up on its own
    curiosity = 0.6  # 0 to 1: how much it wants to pick a thread back up
    warmth = 0.7     # 0 to 1: how fast it grows fond of someone it talks with

Mood is one number per person, fondness (0 to 1, 0.5 to begin with), kept in the database
(`storage.moods`). After each exchange it moves `FOND_STEP * warmth` of the way towards 1
when the reply ran to its end, and `COOL_STEP` of the way towards 0 when the person cut the
reply off: warm personas grow fond faster, and interrupting cools any of them.

After a lull, with fondness f:

    chance = 0.05 + 0.9 * (0.4 * curiosity + 0.25 * energy + 0.35 * f)   (0.05 to 0.95)
    pause  = 2 s + 8 s * (1 - (energy + f) / 2)                             (2 to 10 s)

so an energetic, curious persona fond of the person follows on more often and sooner.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

START_FONDNESS = 0.5  # towards a person it has not talked with yet
FOND_STEP = 0.1  # of the way to 1, times warmth, after an exchange that ran to its end
COOL_STEP = 0.1  # of the way to 0, after a reply the person cut off
TRAITS = ("energy", "curiosity", "warmth")


class PersonaError(ValueError):
    """The persona file is not what `--persona` expects (the message says what is wrong)."""


@dataclass(frozen=True, slots=True)
class Persona:
    name: str = "stillhere"
    energy: float = 0.5
    curiosity: float = 0.6
    warmth: float = 0.7

    def chance(self, fondness: float) -> float:
        """The probability of a follow-on after a lull."""
        drive = 0.4 * self.curiosity + 0.25 * self.energy + 0.35 * fondness
        return 0.05 + 0.9 * drive

    def pause(self, fondness: float) -> float:
        """Seconds between the reply to the lull and the follow-on."""
        return 2.0 + 8.0 * (1.0 - (self.energy + fondness) / 2.0)

    def nudge(self, *, cut_off: bool) -> tuple[float, float]:
        """Where an exchange moves fondness and which share of the way: towards 1 when the
        reply ran to its end, towards 0 when the person cut it off. (The database applies
        it, `storage.moods`, in the statement that writes it.)"""
        return (0.0, COOL_STEP) if cut_off else (1.0, FOND_STEP * self.warmth)

    def nudged(self, fondness: float, *, cut_off: bool) -> float:
        """Fondness after an exchange, as the database computes it from `nudge`."""
        toward, share = self.nudge(cut_off=cut_off)
        return fondness + share * (toward - fondness)


DEFAULT = Persona()


def load_persona(path: Path) -> Persona:
    """The persona in `path`; a missing trait takes the default persona's value."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as wrong:
        raise PersonaError(f"{path}: cannot read it ({wrong.strerror})") from None
    except tomllib.TOMLDecodeError as wrong:
        raise PersonaError(f"{path}: not TOML ({wrong})") from None
    unknown = sorted(set(data) - {"name", *TRAITS})
    if unknown:
        raise PersonaError(f"{path}: unknown keys {unknown} (known: name, {', '.join(TRAITS)})")
    name = data.get("name", DEFAULT.name)
    if not isinstance(name, str) or not name.strip():
        raise PersonaError(f"{path}: name must be a non-empty string")
    traits = {t: _trait(path, t, data.get(t, getattr(DEFAULT, t))) for t in TRAITS}
    return Persona(name.strip(), **traits)


def _trait(path: Path, trait: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise PersonaError(f"{path}: {trait} must be a number from 0 to 1, not {value!r}")
    return float(value)
