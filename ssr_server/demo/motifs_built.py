"""Pictograms of the built world: landmarks and artworks (registered by motif name)."""

from __future__ import annotations

from PIL.ImageDraw import ImageDraw as Draw

from ssr_server.demo.entities import PALETTE, Entity
from ssr_server.demo.shapes import RGB, H, W, frame, motif, shade


@motif("lattice")
def _lattice(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.polygon([(cx - 75, gy), (cx - 8, gy - 210), (cx + 8, gy - 210), (cx + 75, gy)], fill=c)
    d.pieslice((cx - 45, gy - 60, cx + 45, gy + 60), 180, 360, fill=(135, 190, 235))
    for y in (gy - 70, gy - 140):
        d.line((cx - 60, y, cx + 60, y), fill=shade(c, 0.5), width=6)


@motif("pyramid")
def _pyramid(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.polygon([(cx - 130, gy + 10), (cx, gy - 150), (cx + 130, gy + 10)], fill=c)
    d.polygon([(cx, gy - 150), (cx + 130, gy + 10), (cx + 20, gy + 10)], fill=shade(c, 0.7))


@motif("bridge")
def _bridge(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((0, gy - 40, W, gy - 28), fill=c)
    for tx in (cx - 110, cx + 110):
        d.rectangle((tx - 9, gy - 190, tx + 9, gy + 40), fill=c)
    d.arc((cx - 110, gy - 320, cx + 110, gy - 40), 0, 180, fill=c, width=5)
    d.line((0, gy - 45, cx - 110, gy - 185), fill=c, width=5)
    d.line((W, gy - 45, cx + 110, gy - 185), fill=c, width=5)


@motif("statue")
def _statue(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((cx - 45, gy - 60, cx + 45, gy + 20), fill=(150, 140, 120))
    d.polygon([(cx - 30, gy - 60), (cx - 14, gy - 170), (cx + 14, gy - 170), (cx + 30, gy - 60)], fill=c)
    d.ellipse((cx - 16, gy - 200, cx + 16, gy - 168), fill=c)
    d.line((cx + 12, gy - 160, cx + 40, gy - 230), fill=c, width=12)
    d.ellipse((cx + 30, gy - 260, cx + 52, gy - 232), fill=(255, 200, 40))


@motif("dome")
def _dome(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((cx - 90, gy - 90, cx + 90, gy + 10), fill=c)
    d.pieslice((cx - 70, gy - 200, cx + 70, gy - 40), 180, 360, fill=c)
    d.line((cx, gy - 120, cx, gy - 230), fill=shade(c, 0.7), width=4)
    d.rectangle((cx - 24, gy - 60, cx + 24, gy + 10), fill=shade(c, 0.6))
    for mx in (cx - 140, cx + 140):
        d.rectangle((mx - 8, gy - 170, mx + 8, gy + 10), fill=c)


@motif("shells")
def _shells(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((cx - 170, gy - 25, cx + 170, gy + 10), fill=(200, 170, 140))
    for i, (w, h) in enumerate(((70, 150), (60, 120), (50, 95), (40, 70))):
        x = cx - 150 + i * 75
        d.polygon([(x, gy - 25), (x + w, gy - 25 - h), (x + w + 30, gy - 25)], fill=shade(c, 1 - 0.08 * i))


@motif("arena")
def _arena(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((cx - 170, gy - 140, cx + 170, gy + 10), fill=c)
    for row in range(3):
        for col in range(9):
            x, y = cx - 160 + col * 37, gy - 130 + row * 46
            d.rounded_rectangle((x, y, x + 20, y + 34), radius=9, fill=shade(c, 0.4))


@motif("clocktower")
def _clocktower(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((cx - 35, gy - 200, cx + 35, gy + 10), fill=c)
    d.polygon([(cx - 40, gy - 200), (cx, gy - 240), (cx + 40, gy - 200)], fill=shade(c, 0.6))
    d.ellipse((cx - 28, gy - 200, cx + 28, gy - 144), fill=(250, 250, 240), outline=(0, 0, 0), width=3)
    d.line((cx, gy - 172, cx, gy - 195), fill=(0, 0, 0), width=4)
    d.line((cx, gy - 172, cx + 16, gy - 172), fill=(0, 0, 0), width=4)


@motif("leaning")
def _leaning(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.polygon([(cx - 45, gy + 5), (cx + 45, gy + 5), (cx + 80, gy - 200), (cx - 10, gy - 205)], fill=c)
    for k in range(1, 7):
        f = k / 7
        d.line((cx - 45 + 35 * f, gy + 5 - 210 * f, cx + 45 + 35 * f, gy + 5 - 205 * f),
               fill=shade(c, 0.6), width=4)


@motif("lighthouse")
def _lighthouse(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    for k in range(6):
        y0, y1 = gy - 36 * (k + 1), gy - 36 * k
        w0, w1 = 22 + 4 * (5 - k), 22 + 4 * (6 - k)
        d.polygon([(cx - w1, y1), (cx - w0, y0), (cx + w0, y0), (cx + w1, y1)],
                  fill=c if k % 2 == 0 else PALETTE["white"])
    d.rectangle((cx - 18, gy - 246, cx + 18, gy - 216), fill=(255, 240, 120))
    d.polygon([(cx + 18, gy - 236), (W, gy - 290), (W, gy - 190)], fill=(255, 250, 190))


@motif("portrait")
def _portrait(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    x0, y0, x1, y1 = frame(d, (70, 80, 50))
    m = (x0 + x1) // 2
    d.ellipse((m - 80, y0 + 150, m + 80, y1 + 80), fill=c)
    d.ellipse((m - 50, y0 + 40, m + 50, y0 + 160), fill=(45, 30, 20))
    d.ellipse((m - 35, y0 + 50, m + 35, y0 + 145), fill=(215, 180, 120))


@motif("swirls")
def _swirls(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    x0, y0, x1, y1 = frame(d, c)
    for k in range(4):
        d.arc((x0 + 30 + 60 * k, y0 + 30, x0 + 130 + 60 * k, y0 + 110), 0, 300, fill=(120, 170, 230), width=6)
    for sx, sy in ((x0 + 40, y0 + 20), (x1 - 60, y0 + 40), (x1 - 30, y0 + 110)):
        d.ellipse((sx - 14, sy - 14, sx + 14, sy + 14), fill=(250, 220, 60))
    d.polygon([(x0 + 40, y1), (x0 + 70, y0 + 40), (x0 + 100, y1)], fill=(20, 40, 20))
    d.rectangle((x0 + 120, y1 - 40, x1, y1), fill=(40, 50, 70))


@motif("wave")
def _wave(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    x0, y0, x1, y1 = frame(d, (235, 225, 200))
    d.polygon([(x1 - 120, y1 - 40), (x1 - 90, y1 - 80), (x1 - 60, y1 - 40)], fill=(80, 90, 130))
    d.pieslice((x0 - 60, y0 + 20, x0 + 220, y1 + 160), 270, 360, fill=c)
    d.rectangle((x0, y1 - 40, x1, y1), fill=c)
    for k in range(6):
        fx, fy = x0 + 120 + 14 * k, y0 + 20 + 10 * k
        d.ellipse((fx, fy, fx + 20, fy + 20), fill=(250, 250, 250))


@motif("orchard")
def _orchard(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    x0, y0, _, _ = frame(d, (225, 230, 215))
    for k in range(12):  # the painting shows exactly twelve trees
        tx, ty = x0 + 30 + (k % 6) * 55, y0 + 70 + (k // 6) * 100
        d.rectangle((tx - 4, ty, tx + 4, ty + 40), fill=(90, 60, 30))
        d.ellipse((tx - 22, ty - 40, tx + 22, ty + 4), fill=c)


@motif("sculpture")
def _sculpture(d: Draw, e: Entity, c: RGB, cx: int, gy: int) -> None:
    d.rectangle((0, gy - 10, W, H), fill=(50, 90, 140))
    d.rectangle((cx - 50, gy - 40, cx + 50, gy + 30), fill=(120, 120, 120))
    d.polygon([(cx - 25, gy - 40), (cx - 10, gy - 160), (cx + 10, gy - 160), (cx + 25, gy - 40)], fill=c)
    d.ellipse((cx - 15, gy - 190, cx + 15, gy - 160), fill=c)
    d.line((cx - 10, gy - 150, cx - 50, gy - 220), fill=c, width=11)
    d.pieslice((cx - 80, gy - 250, cx - 30, gy - 205), 0, 270, fill=(230, 200, 180))
