"""timm's eval resize and centre crop at a cost bounded by the source and the output, whatever the image's shape.

timm's eval transform (``crop_mode`` center) resizes the shorter side to ``input_size / crop_pct``, the longer in
proportion, then keeps the centre: a 100000x1 PNG of a few hundred bytes would first become 22,400,000x224 pixels.
:class:`ResizeCenterCrop` does what timm does, bit for bit, while that resize is no larger than the source or
:data:`WHOLE_RESIZE_CROPS` crops (every ordinary image: a downscale, or an upscale up to 4:1); beyond, it computes
where the crop lies in the source and resamples only that box (:func:`resample_box`), with the whole resize's scale
and filter, so it reads the box and the filter's reach and writes the output. That path is timm's up to rounding (a
few levels of 255 here and there: PIL takes the box as float32 and may run its two passes in the other order).
"""
import math

from PIL import Image
from timm.data.transforms import str_to_pil_interp

# how far each PIL filter reaches, in source pixels at scale 1 (Resample.c's ``support``)
_SUPPORT = {Image.Resampling.NEAREST: 1.0, Image.Resampling.BOX: 0.5, Image.Resampling.BILINEAR: 1.0,
            Image.Resampling.HAMMING: 1.0, Image.Resampling.BICUBIC: 2.0, Image.Resampling.LANCZOS: 3.0}
# the whole resize is done, as timm does it, while it has no more pixels than the source or this many crops
WHOLE_RESIZE_CROPS = 4


class ResizeCenterCrop:
    """A PIL image -> its centre crop of ``size`` (height, width) after timm's eval resize to ``size / crop_pct``,
    the aspect ratio kept (torchvision's ``Resize(int)`` for a square size, timm's ``ResizeKeepRatio`` otherwise)."""

    def __init__(self, size: tuple[int, int], crop_pct: float, interpolation: str = "bicubic"):
        self.size = (int(size[0]), int(size[1]))
        self.scale_size = tuple(math.floor(side / crop_pct) for side in self.size)
        self.interpolation = interpolation
        self.resample = str_to_pil_interp(interpolation)

    def resized(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) timm's resize gives an image of ``width`` x ``height``."""
        scale_h, scale_w = self.scale_size
        if scale_h == scale_w:  # torchvision: the shorter side to it, the longer in proportion, truncated
            if width <= height:
                return scale_w, int(scale_w * height / width)
            return int(scale_h * width / height), scale_h
        ratio = min(height / scale_h, width / scale_w)  # ResizeKeepRatio: both sides rounded
        return round(width / ratio), round(height / ratio)

    def crop_box(self, width: int, height: int) -> tuple[float, float, float, float]:
        """(left, top, right, bottom) in the source of the crop that timm takes from the resized image."""
        resized_w, resized_h = self.resized(width, height)
        left, top = self._offset(resized_w, resized_h)
        crop_h, crop_w = self.size
        scale_x, scale_y = width / resized_w, height / resized_h
        return (left * scale_x, top * scale_y, min((left + crop_w) * scale_x, width),
                min((top + crop_h) * scale_y, height))

    def __call__(self, image: Image.Image) -> Image.Image:
        width, height = image.size
        resized_w, resized_h = self.resized(width, height)
        crop_h, crop_w = self.size
        if resized_w * resized_h > max(width * height, WHOLE_RESIZE_CROPS * crop_w * crop_h):
            return resample_box(image, self.crop_box(width, height), (crop_w, crop_h), self.resample)
        if (resized_w, resized_h) != (width, height):  # torchvision leaves an image of the size as it is
            image = image.resize((resized_w, resized_h), self.resample)
        left, top = self._offset(resized_w, resized_h)
        return image.crop((left, top, left + crop_w, top + crop_h))

    def _offset(self, resized_w: int, resized_h: int) -> tuple[int, int]:
        """(left, top) of torchvision's ``CenterCrop`` in the resized image."""
        crop_h, crop_w = self.size
        return int(round((resized_w - crop_w) / 2.0)), int(round((resized_h - crop_h) / 2.0))

    def __repr__(self) -> str:
        return f"ResizeCenterCrop(size={self.size}, scale_size={self.scale_size}, interpolation={self.interpolation})"


def resample_box(image: Image.Image, box: tuple[float, float, float, float], size: tuple[int, int],
                 resample: int) -> Image.Image:
    """``box`` (left, top, right, bottom, in source pixels) of ``image`` resampled to ``size`` (width, height), as
    ``image.resize(size, resample, box=box)`` does, but from a crop of the pixels the filter reads: the first of
    PIL's two passes may otherwise run along the source's whole width or height."""
    left, top, right, bottom = box
    support = _SUPPORT.get(resample, 3.0)
    x0, x1 = _reach(left, right, size[0], image.width, support)
    y0, y1 = _reach(top, bottom, size[1], image.height, support)
    return image.crop((x0, y0, x1, y1)).resize(size, resample, box=(left - x0, top - y0, right - x0, bottom - y0))


def _reach(start: float, end: float, out: int, limit: int, support: float) -> tuple[int, int]:
    """The whole source pixels [first, last) that a filter of ``support`` reads resampling [start, end) to ``out``
    pixels, one more each side; PIL stops at the image's edges, and so does this."""
    reach = support * max((end - start) / out, 1.0)
    return max(0, math.floor(start - reach) - 1), min(limit, math.ceil(end + reach) + 1)
