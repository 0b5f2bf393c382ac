// Colour adjustments with Pillow's arithmetic: what torchvision's
// adjust_brightness / adjust_contrast / adjust_saturation / adjust_hue (and
// so ColorJitter) compute on a PIL image, bit for bit.
//
//   lockstep::adjust_brightness(image, 1.2);   // ImageEnhance.Brightness(img).enhance(1.2)
//   lockstep::adjust_contrast(image, 0.8);     // blend with the mean gray level
//   lockstep::adjust_saturation(image, 0.5);   // blend with the luma image
//   lockstep::adjust_hue(image, -0.1);         // rotate H in Pillow's 8-bit HSV
//
// Each works in place on gray or RGB images; hue leaves gray images alone,
// as torchvision does.
#pragma once

#include "lockstep/data/image/image.h"

namespace lockstep {

void adjust_brightness(Image& image, double factor);
void adjust_contrast(Image& image, double factor);
void adjust_saturation(Image& image, double factor);
// factor in [-0.5, 0.5].
void adjust_hue(Image& image, double factor);

}  // namespace lockstep
