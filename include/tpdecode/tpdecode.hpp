// tpdecode: decode-time tensor-parallel building blocks. The one header an engine
// includes: teams, the comm object, DecodeGemm and its tuner, GemmProgram and
// MlpBlockProgram, TeamProgram, PreparedOproj, the drafter's logits path, tensors, errors,
// device buffers.
#pragma once

#include "tpdecode/comm.hpp"
#include "tpdecode/cublas_context.hpp"
#include "tpdecode/decode_gemm.hpp"
#include "tpdecode/device_buffer.hpp"
#include "tpdecode/device_info.hpp"
#include "tpdecode/draft_logits.hpp"
#include "tpdecode/error.hpp"
#include "tpdecode/gemm_decision.hpp"
#include "tpdecode/gemm_program.hpp"
#include "tpdecode/gemm_tuner.hpp"
#include "tpdecode/local_team.hpp"
#include "tpdecode/mlp_block_program.hpp"
#include "tpdecode/nccl_team.hpp"
#include "tpdecode/oproj.hpp"
#include "tpdecode/team.hpp"
#include "tpdecode/team_mlp_block.hpp"
#include "tpdecode/team_program.hpp"
#include "tpdecode/tensor.hpp"
#include "tpdecode/version.hpp"
