"""Name the colour of a square drawn in a small generated PNG image."""

import base64
import inspect
import os
import random
import struct
import zlib
from collections.abc import Callable, Mapping
from typing import get_type_hints

from ors import (
    Environment,
    ImageBlock,
    JSONObject,
    JSONValue,
    ListToolsOutput,
    Split,
    TextBlock,
    ToolOutput,
    ToolSpec,
    tool,
)
from pydantic import BaseModel, Field

IMAGE_SIZE = 32
BACKGROUND = (235, 235, 235)
PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "orange": (245, 140, 20),
    "yellow": (245, 220, 30),
    "green": (40, 170, 60),
    "blue": (30, 80, 220),
    "purple": (130, 50, 180),
    "pink": (245, 130, 190),
    "brown": (120, 75, 35),
    "black": (15, 15, 15),
}
SPLIT_SIZES: dict[str, int] = {"train": 240, "test": 60}
NOT_AVAILABLE = "tool not available for this task"

Pixels = list[list[tuple[int, int, int]]]


def encode_png(pixels: Pixels) -> bytes:
    """Encode rows of RGB tuples as an 8-bit truecolour PNG."""
    height, width = len(pixels), len(pixels[0])
    # Each scanline is prefixed with filter type 0 (None).
    raw = b"".join(b"\x00" + bytes(channel for pixel in row for channel in pixel) for row in pixels)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def render(task_spec: JSONObject, scale: int = 1) -> bytes:
    colour_name, square = task_spec.get("colour"), task_spec.get("square")
    if colour_name not in PALETTE or not isinstance(square, Mapping):
        raise ValueError("task_spec needs a palette 'colour' and a 'square' with x, y and size")
    colour = PALETTE[str(colour_name)]
    x, y, side = int(square["x"]), int(square["y"]), int(square["size"])
    pixels = [
        [
            colour if x <= col // scale < x + side and y <= row // scale < y + side else BACKGROUND
            for col in range(IMAGE_SIZE * scale)
        ]
        for row in range(IMAGE_SIZE * scale)
    ]
    return encode_png(pixels)


def _make_task(split: str, index: int) -> JSONObject:
    rng = random.Random(f"vision/{split}/{index}")
    colour = rng.choice(sorted(PALETTE))
    side = rng.randint(8, 16)
    task: dict[str, JSONValue] = {
        "id": f"{split}-{index}",
        "colour": colour,
        "square": {
            "x": rng.randint(0, IMAGE_SIZE - side),
            "y": rng.randint(0, IMAGE_SIZE - side),
            "size": side,
        },
        "zoomable": rng.random() < 0.5,
    }
    if rng.random() < 0.5:
        task["hint"] = f"The colour's name starts with '{colour[0]}' and has {len(colour)} letters."
    return task


def _normalise_colour(text: str) -> str:
    return text.strip().strip(".!").strip().lower()


class AnswerParams(BaseModel):
    colour: str = Field(description=f"The square's colour, one of: {', '.join(sorted(PALETTE))}.")


class ZoomParams(BaseModel):
    factor: int = Field(default=4, ge=2, le=8, description="Magnification factor.")


class Vision(Environment):
    # Which task-specific tools a task offers, decided from its spec.
    TASK_TOOLS: dict[str, Callable[[JSONObject], bool]] = {
        "zoom": lambda spec: bool(spec.get("zoomable")),
        "hint": lambda spec: bool(spec.get("hint")),
    }

    def __init__(self, task_spec: JSONObject | None = None, secrets: Mapping[str, str] | None = None) -> None:
        super().__init__(task_spec or {}, secrets or {})
        self._secrets: dict[str, str] = dict(secrets or {})

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train"), Split(name="test", type="test")]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        if split not in SPLIT_SIZES:
            raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLIT_SIZES)}")
        return [_make_task(split, i) for i in range(SPLIT_SIZES[split])]

    def get_prompt(self) -> list[TextBlock | ImageBlock]:
        return [
            TextBlock(
                text=(
                    "What colour is the square in this image? "
                    f"Call the `answer` tool with one of: {', '.join(sorted(PALETTE))}."
                )
            ),
            ImageBlock(data=base64.b64encode(render(self.task_spec)).decode("ascii"), mimeType="image/png"),
        ]

    def _available(self, name: str) -> bool:
        return self.TASK_TOOLS[name](self.task_spec)

    def list_task_tools(self) -> ListToolsOutput:
        specs = []
        for name in sorted(self.TASK_TOOLS):
            if not self._available(name):
                continue
            fn = getattr(type(self), name)
            hints = get_type_hints(fn)
            params = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
            schema = hints[params[0].name].model_json_schema() if params else None
            specs.append(ToolSpec(name=name, description=(fn.__doc__ or "").strip(), input_schema=schema))
        return ListToolsOutput(tools=specs)

    @tool
    def answer(self, params: AnswerParams) -> ToolOutput:
        """Give the colour of the square. Ends the episode."""
        correct = _normalise_colour(params.colour) == str(self.task_spec["colour"])
        return ToolOutput(
            blocks=[TextBlock(text="Correct." if correct else "Incorrect.")],
            reward=1.0 if correct else 0.0,
            finished=True,
        )

    @tool(shared=False)
    def zoom(self, params: ZoomParams) -> ToolOutput:
        """Return the image magnified by an integer factor."""
        if not self._available("zoom"):
            return ToolOutput(blocks=[TextBlock(text=NOT_AVAILABLE)], reward=0.0, finished=False)
        image = base64.b64encode(render(self.task_spec, scale=params.factor)).decode("ascii")
        return ToolOutput(
            blocks=[
                TextBlock(text=f"Image magnified {params.factor}x."),
                ImageBlock(data=image, mimeType="image/png"),
            ],
            reward=0.0,
            finished=False,
        )

    @tool(shared=False)
    def hint(self) -> ToolOutput:
        """Get a hint about the square's colour."""
        if not self._available("hint"):
            return ToolOutput(blocks=[TextBlock(text=NOT_AVAILABLE)], reward=0.0, finished=False)
        return ToolOutput(blocks=[TextBlock(text=str(self.task_spec["hint"]))], reward=0.0, finished=False)


if __name__ == "__main__":
    from ors import Server

    Server([Vision]).run(port=int(os.environ.get("PORT", "8080")))
