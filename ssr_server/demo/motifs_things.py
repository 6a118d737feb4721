"""Pictograms of animals, foods and vehicles (registered by motif name)."""

from __future__ import annotations

from PIL import ImageFont
from PIL.ImageDraw import ImageDraw as Draw

from ssr_server.demo.entities import PALETTE, Entity
from ssr_server.demo.shapes import RGB, W, motif, shade, wheel

_WHITE, _BLACK = PALETTE["white"], PALETTE["black"]


def _eye(d: Draw, x: int, y: int, r: int = 5) -> None:
    d.ellipse((x - r, y - r, x + r, y + r), fill=(10, 10, 10))


@motif("panda")
def _panda(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.ellipse((cx - 90, gy - 120, cx + 60, gy), fill=_WHITE)
    for lx in (cx - 70, cx + 30):
        d.ellipse((lx - 18, gy - 50, lx + 18, gy + 10), fill=c)
    d.ellipse((cx + 20, gy - 170, cx + 110, gy - 90), fill=_WHITE)
    for ex in (cx + 30, cx + 100):
        d.ellipse((ex - 14, gy - 182, ex + 14, gy - 154), fill=c)
    for ex in (cx + 50, cx + 82):
        d.ellipse((ex - 10, gy - 145, ex + 10, gy - 125), fill=c)


@motif("penguin")
def _penguin(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.ellipse((cx - 55, gy - 200, cx + 55, gy + 10), fill=c)
    d.ellipse((cx - 35, gy - 150, cx + 35, gy), fill=_WHITE)
    d.ellipse((cx - 35, gy - 250, cx + 35, gy - 180), fill=c)
    d.ellipse((cx - 40, gy - 190, cx - 15, gy - 165), fill=(250, 200, 40))
    d.polygon([(cx + 25, gy - 225), (cx + 60, gy - 215), (cx + 25, gy - 208)], fill=(240, 130, 30))
    d.ellipse((cx + 8, gy - 230, cx + 18, gy - 220), fill=_WHITE)


@motif("whale")
def _whale(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((0, gy - 60, W, gy + 200), fill=(20, 60, 120))
    d.ellipse((cx - 170, gy - 110, cx + 120, gy - 10), fill=c)
    d.polygon([(cx + 100, gy - 60), (cx + 190, gy - 120), (cx + 170, gy - 60), (cx + 190, gy)], fill=c)
    _eye(d, cx - 120, gy - 70)


@motif("fox")
def _fox(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.ellipse((cx - 80, gy - 100, cx + 60, gy - 30), fill=c)
    d.ellipse((cx - 190, gy - 100, cx - 70, gy - 60), fill=c)
    d.ellipse((cx - 200, gy - 95, cx - 165, gy - 65), fill=_WHITE)
    d.polygon([(cx + 40, gy - 130), (cx + 110, gy - 85), (cx + 40, gy - 60)], fill=c)
    d.polygon([(cx + 40, gy - 130), (cx + 50, gy - 165), (cx + 65, gy - 118)], fill=shade(c, 0.7))
    for lx in (cx - 60, cx + 40):
        d.rectangle((lx - 6, gy - 40, lx + 6, gy + 10), fill=_BLACK)
    _eye(d, cx + 70, gy - 100, 4)


@motif("cat")
def _cat(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.ellipse((cx - 100, gy - 110, cx + 60, gy - 30), fill=shade(c, 1.5))
    d.arc((cx - 220, gy - 150, cx - 60, gy + 10), 90, 270, fill=shade(c, 1.5), width=16)
    d.ellipse((cx + 30, gy - 150, cx + 110, gy - 80), fill=shade(c, 1.5))
    spots = ((cx - 70, gy - 90), (cx - 30, gy - 70), (cx, gy - 95), (cx + 30, gy - 60), (cx - 60, gy - 55))
    for sx, sy in spots:
        d.ellipse((sx - 7, sy - 7, sx + 7, sy + 7), fill=shade(c, 0.4))
    for lx in (cx - 75, cx + 35):
        d.rectangle((lx - 8, gy - 40, lx + 8, gy + 10), fill=shade(c, 1.3))
    _eye(d, cx + 85, gy - 120, 5)


@motif("koala")
def _koala(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((cx + 50, 0, cx + 80, gy + 20), fill=(110, 80, 50))
    d.ellipse((cx - 60, gy - 130, cx + 60, gy + 5), fill=c)
    d.ellipse((cx - 55, gy - 220, cx + 55, gy - 110), fill=c)
    for ex in (cx - 55, cx + 55):
        d.ellipse((ex - 30, gy - 235, ex + 30, gy - 175), fill=shade(c, 1.6))
    d.ellipse((cx - 14, gy - 175, cx + 14, gy - 140), fill=_BLACK)
    _eye(d, cx - 25, gy - 180)
    _eye(d, cx + 25, gy - 180)


@motif("axolotl")
def _axolotl(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((0, gy - 40, W, gy + 200), fill=(60, 110, 100))
    d.ellipse((cx - 160, gy - 90, cx + 80, gy - 30), fill=c)
    d.ellipse((cx + 40, gy - 115, cx + 140, gy - 35), fill=c)
    for k in range(3):
        d.line((cx + 60, gy - 100 + 15 * k, cx + 20, gy - 140 + 25 * k), fill=(220, 50, 100), width=7)
    _eye(d, cx + 110, gy - 85)
    d.arc((cx + 90, gy - 70, cx + 125, gy - 50), 0, 180, fill=(60, 20, 40), width=3)


@motif("flamingo")
def _flamingo(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.line((cx, gy - 110, cx, gy + 10), fill=c, width=6)
    d.ellipse((cx - 70, gy - 170, cx + 50, gy - 100), fill=c)
    d.arc((cx + 10, gy - 250, cx + 90, gy - 140), 90, 270, fill=c, width=12)
    d.ellipse((cx + 30, gy - 260, cx + 70, gy - 225), fill=c)
    d.polygon([(cx + 65, gy - 250), (cx + 95, gy - 230), (cx + 65, gy - 232)], fill=_BLACK)


def _plate(d: Draw, cx: int, gy: int, r: int = 120) -> tuple[int, int]:
    """Foods are served on a white plate on a table top that covers the ground."""
    d.rectangle((0, gy - 60, W, 320), fill=(150, 100, 60))
    cy = gy + 10
    d.ellipse((cx - r, cy - r * 2 // 3, cx + r, cy + r * 2 // 3), fill=(240, 240, 240))
    return cx, cy


@motif("pizza")
def _pizza(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    x, y = _plate(d, cx, gy)
    d.ellipse((x - 105, y - 68, x + 105, y + 68), fill=(210, 150, 70))
    d.ellipse((x - 90, y - 56, x + 90, y + 56), fill=c)
    for mx, my in ((-50, -20), (20, -30), (40, 20), (-20, 25)):
        d.ellipse((x + mx - 16, y + my - 11, x + mx + 16, y + my + 11), fill=(250, 245, 225))
    for bx, by in ((-10, -5), (60, -5), (-55, 15)):
        d.ellipse((x + bx - 9, y + by - 6, x + bx + 9, y + by + 6), fill=(40, 130, 40))


@motif("sushi")
def _sushi(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((0, gy - 60, W, 320), fill=(60, 40, 30))
    d.rectangle((cx - 170, gy - 20, cx + 170, gy + 50), fill=(200, 160, 100))
    for k in range(3):
        x = cx - 150 + 80 * k
        d.rounded_rectangle((x, gy - 30, x + 60, gy + 5), radius=12, fill=c)
        d.rounded_rectangle((x - 4, gy - 44, x + 64, gy - 24), radius=8, fill=(245, 120, 70))
    d.ellipse((cx + 95, gy - 45, cx + 160, gy + 20), fill=(15, 30, 15))
    d.ellipse((cx + 105, gy - 35, cx + 150, gy + 10), fill=c)


@motif("croissant")
def _croissant(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    x, y = _plate(d, cx, gy)
    d.ellipse((x - 100, y - 55, x + 100, y + 35), fill=c)
    d.ellipse((x - 70, y - 15, x + 70, y + 70), fill=(240, 240, 240))  # bite out the inner curve
    for k in (-60, -25, 25, 60):
        d.line((x + k, y - 50, x + k * 1.2, y - 5), fill=shade(c, 0.6), width=5)


@motif("paella")
def _paella(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((0, gy - 60, W, 320), fill=(90, 70, 60))
    y = gy + 10
    d.ellipse((cx - 150, y - 90, cx + 150, y + 90), fill=(50, 50, 55))
    d.ellipse((cx - 130, y - 76, cx + 130, y + 76), fill=c)
    for k in range(5):
        sx, sy = cx - 90 + 45 * k, y - 30 + (k % 2) * 45
        d.arc((sx - 18, sy - 14, sx + 18, sy + 14), 0, 270, fill=(235, 90, 60), width=8)
    for k in range(8):
        d.ellipse((cx - 100 + 27 * k, y + 5 - (k % 3) * 20, cx - 90 + 27 * k, y + 15 - (k % 3) * 20),
                  fill=(60, 160, 50))


@motif("ramen")
def _ramen(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((0, gy - 40, W, 320), fill=(200, 190, 170))
    d.pieslice((cx - 130, gy - 120, cx + 130, gy + 80), 0, 180, fill=(180, 30, 30))
    d.ellipse((cx - 130, gy - 50, cx + 130, gy - 10), fill=c)
    for k in range(4):
        nx = cx - 100 + 40 * k
        d.arc((nx, gy - 45, nx + 60, gy - 15), 180, 360, fill=(245, 220, 120), width=5)
    d.ellipse((cx + 40, gy - 48, cx + 80, gy - 22), fill=(250, 250, 245))
    d.ellipse((cx + 52, gy - 42, cx + 68, gy - 28), fill=(240, 170, 40))
    d.line((cx + 60, gy - 160, cx - 40, gy - 30), fill=(90, 60, 30), width=6)


def _windows(d: Draw, x0: int, y0: int, n: int, step: int = 34, w: int = 24, h: int = 22) -> None:
    for k in range(n):
        d.rectangle((x0 + step * k, y0, x0 + step * k + w, y0 + h), fill=(60, 80, 100))


@motif("train")
def _train(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((0, gy + 5, W, gy + 15), fill=(80, 80, 80))
    d.rectangle((0, gy - 70, cx + 60, gy + 5), fill=c)
    d.pieslice((cx - 40, gy - 70, cx + 180, gy + 80), 270, 360, fill=c)
    d.rectangle((0, gy - 20, cx + 130, gy - 10), fill=(30, 60, 170))
    _windows(d, 10, gy - 55, 6)


@motif("delta")
def _delta(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    y = gy - 130
    body = [(cx - 170, y), (cx + 150, y - 8), (cx + 190, y + 6), (cx + 150, y + 14), (cx - 170, y + 16)]
    d.polygon(body, fill=c)
    d.polygon([(cx - 120, y + 10), (cx + 40, y + 10), (cx - 140, y + 80)], fill=shade(c, 0.85))
    d.polygon([(cx - 170, y), (cx - 150, y - 60), (cx - 130, y)], fill=shade(c, 0.8))


@motif("scooter")
def _scooter(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.pieslice((cx - 110, gy - 130, cx + 10, gy - 10), 90, 360, fill=c)
    d.rectangle((cx - 50, gy - 45, cx + 70, gy - 25), fill=c)
    d.polygon([(cx + 60, gy - 40), (cx + 90, gy - 150), (cx + 105, gy - 150), (cx + 85, gy - 30)], fill=c)
    d.line((cx + 80, gy - 150, cx + 120, gy - 160), fill=_BLACK, width=6)
    d.rounded_rectangle((cx - 100, gy - 145, cx - 30, gy - 125), radius=8, fill=(60, 40, 30))
    wheel(d, cx - 70, gy - 5, 26)
    wheel(d, cx + 90, gy - 5, 26)


@motif("bus")
def _bus(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rounded_rectangle((cx - 160, gy - 190, cx + 160, gy - 10), radius=16, fill=c)
    _windows(d, cx - 145, gy - 175, 9)
    _windows(d, cx - 145, gy - 95, 8)
    d.rectangle((cx + 130, gy - 95, cx + 155, gy - 20), fill=(40, 40, 40))
    wheel(d, cx - 100, gy - 8, 24)
    wheel(d, cx + 100, gy - 8, 24)


@motif("rocket")
def _rocket(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((cx - 28, gy - 190, cx + 28, gy), fill=c)
    d.polygon([(cx - 28, gy - 190), (cx, gy - 235), (cx + 28, gy - 190)], fill=c)
    for y in (gy - 200 + 20, gy - 60):
        d.rectangle((cx - 28, y, cx + 28, y + 12), fill=_BLACK)
    d.polygon([(cx - 28, gy - 40), (cx - 55, gy + 5), (cx - 28, gy)], fill=_BLACK)
    d.polygon([(cx + 28, gy - 40), (cx + 55, gy + 5), (cx + 28, gy)], fill=_BLACK)
    font = ImageFont.load_default(size=26)
    for k, ch in enumerate(e.label):  # the label is painted vertically down the side
        d.text((cx - 9, gy - 160 + 30 * k), ch, fill=_BLACK, font=font)


@motif("telescope")
def _telescope(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((0, 0, W, 320), fill=(10, 10, 30))
    for sx, sy in ((40, 40), (400, 60), (300, 280), (80, 250), (200, 30)):
        d.ellipse((sx - 3, sy - 3, sx + 3, sy + 3), fill=(250, 250, 250))
    d.rectangle((cx - 120, 130, cx + 90, 190), fill=shade(c, 1.4))
    d.ellipse((cx + 70, 130, cx + 110, 190), fill=(40, 40, 40))
    for py in (60, 200):
        d.rectangle((cx - 90, py, cx + 20, py + 60), fill=(40, 70, 160))


@motif("tram")
def _tram(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.line((0, gy - 210, W, gy - 210), fill=(40, 40, 40), width=3)
    d.line((cx, gy - 170, cx + 40, gy - 210), fill=(40, 40, 40), width=4)
    d.rounded_rectangle((cx - 200, gy - 170, cx + 150, gy - 20), radius=20, fill=c)
    _windows(d, cx - 185, gy - 150, 6, step=40, w=30, h=40)
    d.rectangle((cx + 70, gy - 150, cx + 140, gy - 90), fill=_WHITE)
    d.text((cx + 78, gy - 146), e.label, fill=_BLACK, font=ImageFont.load_default(size=44))
    wheel(d, cx - 150, gy - 15, 16)
    wheel(d, cx + 100, gy - 15, 16)
