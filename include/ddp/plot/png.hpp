// The PNG is rasterised from the very SVG we wrote (librsvg and cairo, in this
// process), so the two files never show different drawings.
#pragma once

#include <string>

namespace ddp::plot {

// Renders svg at `scale` PNG pixels per SVG px onto white and writes it to
// path. Throws ddp::Error naming path (or librsvg's complaint about the SVG).
void write_png(const std::string& svg, const std::string& path, double scale);

}  // namespace ddp::plot
