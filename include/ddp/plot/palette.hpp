// One colour and one dash pattern per series, the same in every panel and in
// the legend. Colours are matplotlib's default cycle (tab10), which d2l's
// plots use; dashes cycle like d2l's Animator formats ('-', '--', '-.', ':'),
// so runs whose curves coincide (np 1 and np 2 agree over the first epochs)
// still show each line.
#pragma once

#include <cstddef>
#include <string>

namespace ddp::plot {

const std::string& series_colour(size_t i);
const std::string& series_dash(size_t i);  // SVG stroke-dasharray, "" for solid

}  // namespace ddp::plot
