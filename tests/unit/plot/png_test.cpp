// The PNG is the SVG rasterised: read it back with cairo and look at pixels.
#include <gtest/gtest.h>

#include <cairo.h>

#include <cstdint>
#include <cstring>

#include "ddp/plot/png.hpp"
#include "plot_test_util.hpp"

namespace ddp::plot {
namespace {

class Png : public testing::TempDir {};

// RGB of pixel (x, y) of an RGB24/ARGB32 surface.
uint32_t rgb_at(cairo_surface_t* s, int x, int y) {
  const unsigned char* row = cairo_image_surface_get_data(s) + y * cairo_image_surface_get_stride(s);
  uint32_t px;
  std::memcpy(&px, row + 4 * x, 4);
  return px & 0xFFFFFF;
}

TEST_F(Png, RendersTheSvgAtScale) {
  const std::string svg =
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"40\" height=\"20\" viewBox=\"0 0 40 20\">"
      "<rect x=\"20\" y=\"0\" width=\"20\" height=\"20\" fill=\"#1f77b4\"/></svg>";
  const std::string out = path("a.png");
  write_png(svg, out, 2);
  cairo_surface_t* s = cairo_image_surface_create_from_png(out.c_str());
  ASSERT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS);
  EXPECT_EQ(cairo_image_surface_get_width(s), 80);
  EXPECT_EQ(cairo_image_surface_get_height(s), 40);
  EXPECT_EQ(rgb_at(s, 10, 20), 0xFFFFFFu);  // no fill there: the white ground
  EXPECT_EQ(rgb_at(s, 60, 20), 0x1F77B4u);
  cairo_surface_destroy(s);
}

TEST_F(Png, BadSvgAndUnwritablePathAreErrors) {
  const std::string out = path("b.png");
  EXPECT_HAS(testing::error_of([&] { write_png("<svg", out, 1); }), out + ": librsvg cannot read the SVG");
  const std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"4\" height=\"4\"/>";
  const std::string nowhere = path("no/such/dir/c.png");
  EXPECT_HAS(testing::error_of([&] { write_png(svg, nowhere, 1); }), nowhere + ": cannot open for writing");
  EXPECT_HAS(testing::error_of([&] { write_png(svg, out, 0); }), "PNG scale 0");
}

}  // namespace
}  // namespace ddp::plot
