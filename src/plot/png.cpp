#include "ddp/plot/png.hpp"

#include <cairo.h>
#include <librsvg/rsvg.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>

#include "ddp/core/error.hpp"  // DDP_CHECK, DDP_FAIL

namespace ddp::plot {

namespace {

// Owners for the C objects, so that a throw releases them.
struct GObjectUnref {
  void operator()(void* p) const { g_object_unref(p); }
};
struct SurfaceDestroy {
  void operator()(cairo_surface_t* s) const { cairo_surface_destroy(s); }
};
struct CairoDestroy {
  void operator()(cairo_t* c) const { cairo_destroy(c); }
};

}  // namespace

void write_png(const std::string& svg, const std::string& path, double scale) {
  DDP_CHECK(std::isfinite(scale) && scale > 0 && scale <= 16, path, ": PNG scale ", scale, " is not in (0, 16]");
  GError* error = nullptr;
  std::unique_ptr<RsvgHandle, GObjectUnref> handle(
      rsvg_handle_new_from_data(reinterpret_cast<const guint8*>(svg.data()), svg.size(), &error));
  if (!handle) {
    const std::string why = error ? error->message : "unknown error";
    if (error) g_error_free(error);
    DDP_FAIL(path, ": librsvg cannot read the SVG: ", why);
  }
  // Our SVGs give width and height in px, so the intrinsic size is known.
  gdouble w = 0, h = 0;
  DDP_CHECK(rsvg_handle_get_intrinsic_size_in_pixels(handle.get(), &w, &h) && w > 0 && h > 0, path,
            ": the SVG has no size in pixels");
  const int pw = static_cast<int>(std::ceil(w * scale)), ph = static_cast<int>(std::ceil(h * scale));
  std::unique_ptr<cairo_surface_t, SurfaceDestroy> surface(cairo_image_surface_create(CAIRO_FORMAT_RGB24, pw, ph));
  DDP_CHECK(cairo_surface_status(surface.get()) == CAIRO_STATUS_SUCCESS, path, ": cannot make a ", pw, "x", ph,
            " image: ", cairo_status_to_string(cairo_surface_status(surface.get())));
  std::unique_ptr<cairo_t, CairoDestroy> cr(cairo_create(surface.get()));
  cairo_set_source_rgb(cr.get(), 1, 1, 1);
  cairo_paint(cr.get());
  const RsvgRectangle viewport{0, 0, double(pw), double(ph)};
  if (!rsvg_handle_render_document(handle.get(), cr.get(), &viewport, &error)) {
    const std::string why = error ? error->message : "unknown error";
    if (error) g_error_free(error);
    DDP_FAIL(path, ": librsvg cannot render the SVG: ", why);
  }
  cairo_surface_flush(surface.get());
  // Through our own stream: cairo's file writer says only "error while writing
  // to output stream", errno says why.
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  DDP_CHECK(out, path, ": cannot open for writing: ", std::strerror(errno));
  const cairo_status_t st = cairo_surface_write_to_png_stream(
      surface.get(),
      [](void* closure, const unsigned char* data, unsigned int length) {
        auto* os = static_cast<std::ofstream*>(closure);
        os->write(reinterpret_cast<const char*>(data), length);
        return *os ? CAIRO_STATUS_SUCCESS : CAIRO_STATUS_WRITE_ERROR;
      },
      &out);
  out.close();
  DDP_CHECK(st == CAIRO_STATUS_SUCCESS && out, path, ": cannot write the PNG: ",
            st != CAIRO_STATUS_SUCCESS ? cairo_status_to_string(st) : std::strerror(errno));
}

}  // namespace ddp::plot
