// im2col and its adjoint for a chunk of images (Note [conv chunks] in
// conv_engine.hpp): the layout the conv GEMMs read and write.
#pragma once

#include "ddp/nn/cpu/ops.hpp"

namespace ddp::nn::cpu {

// col[(c*k + kh)*k + kw][i*OH*OW + oh*OW + ow] = x_i[c][oh*s - pad + kh][ow*s - pad + kw]
// (zero where that falls in the padding), for images i in [0, nb) of x; col's
// rows are ld >= nb*OH*OW apart (the rest of each row is left alone).
template <typename T>
void im2col(const ConvGeom& g, const T* x, int nb, int64_t ld, T* col);

// dx_i[c][ih][iw] = sum of the col entries im2col copied from there.
// Overwrites dx (nb images).
template <typename T>
void col2im(const ConvGeom& g, const T* col, int nb, int64_t ld, T* dx);

}  // namespace ddp::nn::cpu
