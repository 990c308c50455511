"""The demo corpus's sentences: a small grammar of commands, numbers, names, places and times.

Every sentence is spelled out exactly as spoken (numbers as words), lower-case, so its transcript
is what espeak-ng says. `make_sentence(rng)` draws one; `grammar_vocabulary()` lists every word.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_ONES = _words(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen"
)
_TENS = _words("_ _ twenty thirty forty fifty sixty seventy eighty ninety")
_ORDINALS = _words(
    "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth "
    "thirteenth fourteenth fifteenth sixteenth seventeenth eighteenth nineteenth"
)


def number_to_words(n: int) -> str:
    """0 <= n < 1e6 as spoken English: 23 -> "twenty three", 105 -> "one hundred and five"."""
    if not 0 <= n < 1_000_000:
        raise ValueError(f"number_to_words handles 0 to 999999, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        head = f"{_ONES[n // 100]} hundred"
        return head if n % 100 == 0 else f"{head} and {number_to_words(n % 100)}"
    head, rest = f"{number_to_words(n // 1000)} thousand", n % 1000
    return head if rest == 0 else f"{head} {'and ' if rest < 100 else ''}{number_to_words(rest)}"


def ordinal_to_words(n: int) -> str:
    """1 <= n <= 31 as a spoken day of the month: 3 -> "third", 21 -> "twenty first"."""
    if not 1 <= n <= 31:
        raise ValueError(f"ordinal_to_words handles 1 to 31, got {n}")
    if n < 20:
        return _ORDINALS[n - 1]
    tens = "twenty" if n < 30 else "thirty"
    return f"{tens[:-1]}ieth" if n % 10 == 0 else f"{tens} {_ORDINALS[n % 10 - 1]}"


# `slot: options`: comma-separated phrases, or space-separated words where a line has no comma.
# Options may hold further {slots}; `_` is an empty option (it makes the slot optional); indented
# lines continue the slot above. Number slots are functions, in NUMBER_SLOTS below.
GRAMMAR = """
name: anna ben carla david emma frank grace henry jack kate leo maria peter rachel sam tina william zoe alice
  lucy george martin nina paul sarah thomas laura daniel julia simon james mark
city: london paris berlin madrid rome boston chicago denver seattle toronto dublin vienna prague oslo tokyo
  sydney lisbon athens cairo miami atlanta edinburgh manchester amsterdam
place: station, airport, library, office, bank, park, beach, market, museum, hospital, school, gym, bakery,
  cinema, pharmacy, supermarket, restaurant, hotel, church, theater, zoo, post office, bus stop, gas station,
  swimming pool
room: kitchen, bedroom, living room, bathroom, hallway, garage, garden, office, basement, attic, dining room,
  nursery, guest room, porch
device: lights, lamp, heater, fan, radio, television, oven, dishwasher, washing machine, coffee maker,
  air conditioner, speakers, computer, kettle, microwave
switch: turn on, turn off, switch on, switch off
opening: window, door, curtains, blinds, garage door, back door
openclose: open close
day: monday tuesday wednesday thursday friday saturday sunday
month: january february march april may june july august september october november december
daypart: morning afternoon evening
when: today, tomorrow, tonight, this {daypart}, tomorrow {daypart}, on {day}, next {day}, on {day} {daypart},
  next week, this weekend, _, _
time: {hour} o'clock, half past {hour}, a quarter to {hour}, a quarter past {hour}, {hour} {minute}, noon,
  midnight, {hour} in the {daypart}
food: apples, oranges, bananas, grapes, lemons, tomatoes, potatoes, carrots, onions, eggs, bread, cheese,
  butter, milk, rice, pasta, coffee, tea, juice, chicken, fish, beans, cookies, strawberries, mushrooms,
  peppers, honey, noodles
dish: pizza, soup, salad, pancakes, spaghetti, fried rice, roast chicken, vegetable soup, grilled fish,
  sandwiches
meal: breakfast lunch dinner
drink: tea, coffee, hot chocolate, orange juice, water, lemonade
genre: jazz rock classical pop country blues folk piano dance
color: red blue green yellow white black purple brown pink gray orange
item: keys, wallet, glasses, umbrella, jacket, phone, bag, book, laptop, passport, headphones, hat, scarf,
  gloves, ticket, pen, camera, watch
furniture: table, desk, chair, sofa, shelf, bed, counter, floor, kitchen table, piano
relative: mother father sister brother aunt uncle friend cousin grandmother grandfather daughter son neighbor
  teacher doctor
weather: sunny cloudy rainy windy foggy snowy warm cold hot cool stormy freezing
event: party meeting dinner wedding picnic concert birthday lunch conference trip
transport: bus, train, taxi, flight, ferry, tram, last train, early bus
animal: cats dogs birds horses cows sheep rabbits
thing: chairs, plates, glasses, cups, tables, candles, forks, spoons
task: buy {food}, call {name}, water the plants, take out the trash, feed the cat, walk the dog, pay the rent,
  book the flight, pick up {name} from the {place}, send the report, clean the {room}, wash the car,
  return the library books, bring an umbrella, check the oven, visit my {relative}
message: i'm running late, see you soon, happy birthday, thanks for dinner, call me back, i'm on my way,
  the {event} is cancelled, dinner is ready, i'll be there in {num} minutes, don't forget the tickets,
  good luck {when}, let's meet at the {place}
please: please, could you, can you, _, _
updown: up down
op: plus minus times
"""

# One sentence pattern per line, drawn uniformly.
TEMPLATES = """
{please} {switch} the {room} {device}
{switch} the {device} in the {room} {when}
{please} {openclose} the {opening} in the {room}
set the {room} heater to {num} degrees
set a timer for {num} minutes
set a timer for {small} hours and {num} minutes
set an alarm for {time} {when}
remind me to {task} {when}
{please} remind me to {task} at {time}
call {name} {when} at {time}
send a message to {name} saying {message}
what's the weather like in {city} {when}
will it be {weather} in {city} on {day}
it's {weather} and {weather} in {city} today
how long does it take to drive from {city} to {city}
{name} is meeting {name} at the {place} at {time}
i would like {small} {food} and a cup of {drink} please
add {food} and {food} to the shopping list
{please} play some {genre} music in the {room}
the {transport} to {city} leaves at {time} from platform {small}
my phone number is {digits}
book a table for {small} people at {time} {when}
{name} was born on the {ordinal} of {month} {year}
is the {place} open on {day}
turn the volume {updown} to {num} percent
what is {num} {op} {num}
where did i leave my {item}
i think i left my {item} on the {furniture} in the {room}
good {daypart} {name} how are you
we need {small} more {thing} for the {event} on {day}
my {relative} lives in {city} near the {place}
the {color} {item} is on the {furniture}
{please} pick up {name} from the {place} at {time}
how far is the nearest {place}
the {event} starts at {time} on the {ordinal} of {month}
it costs {num} dollars and {num} cents
there are {big} people living in this town
we saw {small} {animal} near the {place} {when}
let's have {dish} for {meal} {when}
my {relative} is flying to {city} on the {ordinal} of {month}
the {color} {transport} to the {place} is late again
{name} and {name} are cooking {dish} for {meal}
""".strip().splitlines()


def _parse_grammar(text: str) -> dict[str, tuple[str, ...]]:
    joined: dict[str, str] = {}
    name = ""
    for line in text.strip().splitlines():
        if line.startswith(" "):  # continues the slot above
            joined[name] += " " + line.strip()
        else:
            name, _, value = line.partition(":")
            joined[name] = value.strip()
    return {
        name: tuple("" if o.strip() == "_" else o.strip() for o in (v.split(",") if "," in v else v.split()))
        for name, v in joined.items()
    }


def _num(lo: int, hi: int) -> Callable[[random.Random], str]:
    return lambda r: number_to_words(r.randint(lo, hi))


NUMBER_SLOTS: dict[str, Callable[[random.Random], str]] = {
    "hour": _num(1, 12),
    "minute": lambda r: number_to_words(r.choice(range(5, 60, 5))),
    "small": _num(2, 12),
    "num": _num(2, 99),
    "big": _num(100, 9999),
    "ordinal": lambda r: ordinal_to_words(r.randint(1, 31)),
    "year": lambda r: r.choice(("nineteen ", "twenty ")) + number_to_words(r.randint(10, 99)),
    "digits": lambda r: " ".join(r.choice(_ONES[:10]) for _ in range(r.randint(4, 7))),
}
SLOTS: dict[str, Sequence[str] | Callable[[random.Random], str]] = {**_parse_grammar(GRAMMAR), **NUMBER_SLOTS}
_SLOT = re.compile(r"\{(\w+)\}")
_TRANSCRIPT = re.compile(r"[a-z']+( [a-z']+)*")


def _expand(template: str, rng: random.Random) -> str:
    def fill(match: re.Match) -> str:
        slot = SLOTS[match.group(1)]
        return slot(rng) if callable(slot) else _expand(rng.choice(slot), rng)

    return _SLOT.sub(fill, template)


def make_sentence(rng: random.Random, min_words: int = 3, max_words: int = 14) -> str:
    """One grammar sentence of min_words..max_words words: lower-case, spaces and apostrophes."""
    for _ in range(10_000):
        text = " ".join(_expand(rng.choice(TEMPLATES), rng).split())
        if not _TRANSCRIPT.fullmatch(text):
            raise ValueError(f"grammar produced {text!r}, which is not a lower-case transcript; fix GRAMMAR")
        if min_words <= len(text.split()) <= max_words:
            return text
    raise ValueError(f"the grammar makes almost no sentences of {min_words} to {max_words} words; widen the range")


def grammar_vocabulary() -> set[str]:
    """Every word the grammar can produce (numbers up to 9999 included)."""
    words = set(_ONES) | set(_TENS[2:]) | set(_ORDINALS) | {"hundred", "thousand", "and", "twentieth", "thirtieth"}
    for options in (TEMPLATES, *(s for s in SLOTS.values() if not callable(s))):
        words |= {w for o in options for w in _SLOT.sub(" ", o).split()}
    return words
