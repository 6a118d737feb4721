"""The demo world's entities, inline so the package ships them without data files.

Facts are phrased in our own words. A few entities are invented on purpose (a lighthouse, a painting,
a sculpture, a tram): a model cannot know their facts from pre-training, so answering questions about
them proves the search tools were actually used.
"""

from __future__ import annotations

from dataclasses import dataclass

URL_BASE = "https://demo.ssr-server.invalid/wiki/"  # .invalid never resolves: no accidental fetches


@dataclass(frozen=True)
class Entity:
    """One thing the demo world knows about, and how to draw it.

    ``motif`` picks the drawing routine, ``colour`` its main colour (a key of ``PALETTE``) and
    ``label`` optional text painted in the picture, so some questions are answerable from pixels.
    """

    id: str
    title: str
    category: str
    description: str
    facts: tuple[str, ...]
    motif: str
    colour: str
    label: str = ""

    @property
    def url(self) -> str:
        return URL_BASE + self.id


PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (200, 30, 35),
    "orange": (235, 120, 20),
    "yellow": (240, 200, 30),
    "green": (40, 150, 60),
    "teal": (30, 140, 140),
    "blue": (30, 80, 200),
    "navy": (20, 30, 90),
    "purple": (120, 50, 160),
    "pink": (240, 120, 170),
    "brown": (120, 75, 35),
    "grey": (128, 128, 128),
    "black": (20, 20, 20),
    "white": (245, 245, 245),
    "gold": (200, 160, 50),
}


def _e(
    id: str, title: str, category: str, motif: str, colour: str, description: str, *facts: str,
    label: str = "",
) -> Entity:
    return Entity(id, title, category, description, tuple(facts), motif, colour, label)


ENTITIES: tuple[Entity, ...] = (
    # --- landmarks
    _e("eiffel-tower", "Eiffel Tower", "landmark", "lattice", "brown",
       "A wrought-iron lattice tower on the Champ de Mars in Paris, France.",
       "The Eiffel Tower stands about 330 metres tall when its antennas are included.",
       "The Eiffel Tower was finished in 1889 as the entrance arch of the Exposition Universelle.",
       "The company of engineer Gustave Eiffel designed and built the tower."),
    _e("great-pyramid", "Great Pyramid of Giza", "landmark", "pyramid", "gold",
       "The largest of the three pyramids on the Giza plateau near Cairo, Egypt.",
       "The Great Pyramid of Giza was built as a tomb for the pharaoh Khufu around 2560 BC.",
       "When new, the Great Pyramid rose to roughly 146 metres.",
       "It is the oldest of the Seven Wonders of the Ancient World and the only one still largely standing."),
    _e("golden-gate-bridge", "Golden Gate Bridge", "landmark", "bridge", "orange",
       "A suspension bridge across the Golden Gate strait at San Francisco, California.",
       "The Golden Gate Bridge opened to traffic in 1937.",
       "The bridge links San Francisco with Marin County across the Golden Gate strait.",
       "Its paint colour is called International Orange."),
    _e("statue-of-liberty", "Statue of Liberty", "landmark", "statue", "teal",
       "A copper statue of a robed woman holding a torch, on Liberty Island in New York Harbor.",
       "The Statue of Liberty was a gift from the people of France and was dedicated in 1886.",
       "The sculptor Frédéric Auguste Bartholdi designed the Statue of Liberty.",
       "Its green colour is a patina that formed as the copper skin weathered."),
    _e("taj-mahal", "Taj Mahal", "landmark", "dome", "white",
       "A white marble mausoleum on the bank of the Yamuna river in Agra, India.",
       "The Mughal emperor Shah Jahan commissioned the Taj Mahal in memory of his wife Mumtaz Mahal.",
       "Work on the Taj Mahal began in 1632.",
       "The Taj Mahal is faced with white marble inlaid with semi-precious stones."),
    _e("sydney-opera-house", "Sydney Opera House", "landmark", "shells", "white",
       "A performing arts centre with sail-like roof shells on Sydney Harbour, Australia.",
       "The Danish architect Jørn Utzon designed the Sydney Opera House.",
       "The Sydney Opera House opened in 1973.",
       "UNESCO listed the Sydney Opera House as a World Heritage Site in 2007."),
    _e("colosseum", "Colosseum", "landmark", "arena", "brown",
       "An oval amphitheatre of stone and concrete in the centre of Rome, Italy.",
       "The Colosseum was completed in 80 AD under the emperor Titus.",
       "The Colosseum could seat an estimated 50,000 to 80,000 spectators.",
       "Gladiator contests and public spectacles were held in the Colosseum."),
    _e("big-ben", "Big Ben", "landmark", "clocktower", "gold",
       "The great bell of the clock tower at the Palace of Westminster in London.",
       "Big Ben is strictly the nickname of the great bell, not of the tower.",
       "The clock tower was renamed Elizabeth Tower in 2012.",
       "The clock tower at Westminster was completed in 1859."),
    _e("leaning-tower-pisa", "Leaning Tower of Pisa", "landmark", "leaning", "white",
       "The free-standing bell tower of the cathedral of Pisa, Italy, famous for its tilt.",
       "Construction of the Leaning Tower of Pisa began in 1173.",
       "The tower started to tilt during construction because its foundation sat on soft ground."),
    _e("varrow-point-lighthouse", "Varrow Point Lighthouse", "landmark", "lighthouse", "red",
       "A red-and-white striped lighthouse on the fictional island of Varrow.",
       "The engineer Maud Tresslin built Varrow Point Lighthouse in 1874.",
       "The lamp of Varrow Point Lighthouse flashes green once every 7 seconds.",
       "Varrow Point Lighthouse is 41 metres tall."),
    # --- artworks
    _e("mona-lisa", "Mona Lisa", "artwork", "portrait", "brown",
       "A half-length portrait of a woman with a faint smile, painted in oil on wood.",
       "Leonardo da Vinci painted the Mona Lisa, starting around 1503.",
       "The Mona Lisa hangs in the Louvre museum in Paris.",
       "The Mona Lisa is painted on a panel of poplar wood."),
    _e("starry-night", "The Starry Night", "artwork", "swirls", "navy",
       "An oil painting of a swirling night sky over a village, with a cypress tree in front.",
       "Vincent van Gogh painted The Starry Night in 1889.",
       "Van Gogh painted it while staying at the asylum in Saint-Rémy-de-Provence.",
       "The Starry Night is held by the Museum of Modern Art in New York."),
    _e("great-wave", "The Great Wave off Kanagawa", "artwork", "wave", "blue",
       "A Japanese woodblock print of a huge wave towering over boats, with a mountain behind.",
       "Katsushika Hokusai made The Great Wave off Kanagawa around 1831.",
       "The print belongs to the series Thirty-six Views of Mount Fuji.",
       "Mount Fuji appears small in the background beneath the wave."),
    _e("copper-orchard", "The Copper Orchard", "artwork", "orchard", "orange",
       "A fictional oil painting of rows of copper-coloured trees under a pale sky.",
       "The painter Ilse Marwen finished The Copper Orchard in 1911.",
       "The Copper Orchard shows exactly 12 copper-coloured trees.",
       "The Copper Orchard hangs in the fictional Halvden Museum."),
    _e("tidecaller", "Tidecaller", "artwork", "sculpture", "green",
       "A fictional bronze sculpture of a figure raising a conch shell, standing in a harbour.",
       "The sculptor Oren Castell cast Tidecaller in bronze in 1968.",
       "Tidecaller stands 6 metres tall in the harbour of the fictional town of Selmouth."),
    # --- animals
    _e("giant-panda", "Giant panda", "animal", "panda", "black",
       "A black-and-white bear native to China.",
       "Bamboo makes up almost all of a giant panda's diet.",
       "Giant pandas live in the mountain forests of central China, mostly in Sichuan.",
       "A newborn giant panda weighs only about 100 grams."),
    _e("emperor-penguin", "Emperor penguin", "animal", "penguin", "black",
       "A large penguin with a yellow patch on its neck, living in Antarctica.",
       "The emperor penguin is the tallest and heaviest of all living penguins.",
       "Emperor penguins breed during the Antarctic winter.",
       "The male emperor penguin keeps the egg warm on its feet."),
    _e("blue-whale", "Blue whale", "animal", "whale", "blue",
       "A huge baleen whale found in all the major oceans.",
       "The blue whale is the largest animal known to have ever lived.",
       "Blue whales can grow longer than 30 metres.",
       "Blue whales feed mainly on tiny crustaceans called krill."),
    _e("red-fox", "Red fox", "animal", "fox", "orange",
       "A small orange-red wild dog with a bushy tail.",
       "The red fox has the widest range of any wild member of the order Carnivora.",
       "The bushy tail of a red fox often ends in a white tip."),
    _e("snow-leopard", "Snow leopard", "animal", "cat", "grey",
       "A pale grey spotted big cat of high mountains.",
       "Snow leopards live in the mountains of Central and South Asia, including the Himalayas.",
       "A snow leopard uses its long thick tail for balance and wraps it around itself for warmth.",
       "Unlike lions and tigers, snow leopards cannot roar."),
    _e("koala", "Koala", "animal", "koala", "grey",
       "A tree-dwelling marsupial from eastern Australia.",
       "Koalas feed almost only on eucalyptus leaves.",
       "A koala sleeps around 18 to 22 hours a day."),
    _e("axolotl", "Axolotl", "animal", "axolotl", "pink",
       "A pink salamander with feathery external gills.",
       "The wild axolotl lives only in the lake complex of Xochimilco near Mexico City.",
       "Axolotls keep larval features such as external gills throughout adult life.",
       "An axolotl can regrow lost limbs."),
    _e("flamingo", "Flamingo", "animal", "flamingo", "pink",
       "A tall pink wading bird with a bent bill.",
       "A flamingo gets its pink colour from carotenoid pigments in the algae and shrimp it eats.",
       "Flamingos often rest standing on one leg.",
       "A flamingo feeds by filtering water with its head held upside down."),
    # --- foods
    _e("pizza-margherita", "Pizza Margherita", "food", "pizza", "red",
       "A flat round pizza topped with tomato, mozzarella and basil.",
       "Pizza Margherita comes from Naples, Italy.",
       "Its tomato, mozzarella and basil echo the red, white and green of the Italian flag.",
       "Tradition says the pizza was named after Queen Margherita of Savoy."),
    _e("sushi", "Sushi", "food", "sushi", "white",
       "A Japanese dish of vinegared rice served with fish, seafood or vegetables.",
       "The defining ingredient of sushi is rice seasoned with vinegar.",
       "Nigiri sushi is a hand-pressed ball of rice topped with a slice of fish.",
       "Maki sushi is rolled up in a sheet of nori seaweed."),
    _e("croissant", "Croissant", "food", "croissant", "gold",
       "A flaky crescent-shaped pastry made from layered buttery dough.",
       "The croissant descends from the Austrian kipferl, although it is now linked with France.",
       "Croissant dough is laminated: butter is folded into it many times to form thin layers."),
    _e("paella", "Paella", "food", "paella", "yellow",
       "A Spanish rice dish cooked in a wide shallow pan.",
       "Paella comes from the Valencia region of Spain.",
       "Saffron gives paella its yellow colour.",
       "The wide shallow pan used to cook it is also called a paella."),
    _e("ramen", "Ramen", "food", "ramen", "brown",
       "A Japanese soup of wheat noodles in a rich broth.",
       "Ramen is made with wheat noodles served in a hot broth.",
       "Common ramen broths include shoyu, miso, shio and tonkotsu."),
    # --- vehicles and machines
    _e("shinkansen", "Shinkansen", "vehicle", "train", "white",
       "Japan's network of high-speed railway lines, known abroad as the bullet train.",
       "The first Shinkansen line, the Tokaido Shinkansen, opened in 1964.",
       "The Tokaido Shinkansen connected Tokyo and Osaka just before the Tokyo Olympic Games."),
    _e("concorde", "Concorde", "vehicle", "delta", "white",
       "A supersonic passenger airliner with a slender delta wing and a drooping nose.",
       "Concorde was developed jointly by British and French aircraft makers.",
       "Concorde cruised at about twice the speed of sound.",
       "Concorde was retired from service in 2003."),
    _e("vespa", "Vespa", "vehicle", "scooter", "teal",
       "An Italian motor scooter with a curved steel body.",
       "Piaggio has made the Vespa scooter in Italy since 1946.",
       "Vespa is the Italian word for wasp."),
    _e("routemaster", "Routemaster bus", "vehicle", "bus", "red",
       "A red double-decker bus that served London for decades.",
       "The Routemaster double-decker bus entered service in London in 1956.",
       "The open platform at the back of a Routemaster let passengers hop on and off."),
    _e("saturn-v", "Saturn V", "vehicle", "rocket", "white",
       "A tall three-stage rocket that launched the Apollo missions to the Moon.",
       "NASA used the Saturn V rocket for the Apollo Moon landing missions.",
       "The Saturn V stood about 110 metres tall.",
       "Apollo 11 was launched on a Saturn V in 1969.",
       label="USA"),
    _e("hubble", "Hubble Space Telescope", "vehicle", "telescope", "grey",
       "A large space telescope in orbit around Earth.",
       "The Hubble Space Telescope was launched in 1990 aboard the Space Shuttle Discovery.",
       "Hubble is named after the astronomer Edwin Hubble.",
       "The main mirror of the Hubble Space Telescope is 2.4 metres across."),
    _e("kestrel-tram", "Kestrel K7 tram", "vehicle", "tram", "yellow",
       "A fictional yellow articulated tram from the city of Brennholt.",
       "The Kestrel K7 tram entered service in the fictional city of Brennholt in 1998.",
       "A Kestrel K7 tram has seats for 64 passengers.",
       label="K7"),
)
