#include "names.h"

#include "moe/error.h"

namespace moe::python {

ScoringFunc parse_scoring(std::string_view name, const char* argument) {
  for (ScoringFunc scoring : {ScoringFunc::kSoftmax, ScoringFunc::kSigmoid}) {
    if (name == scoring_name(scoring)) return scoring;
  }
  fail("{}: expected \"softmax\" or \"sigmoid\"; got \"{}\"", argument, name);
}

Activation parse_activation(std::string_view name, const char* argument) {
  for (Activation activation :
       {Activation::kSilu, Activation::kGelu, Activation::kGeluTanh, Activation::kClampedSwiglu}) {
    if (name == activation_name(activation)) return activation;
  }
  if (name == "swigluoai") return Activation::kClampedSwiglu;
  fail(
      "{}: expected \"silu\", \"gelu\", \"gelu_tanh\" or \"clamped_swiglu\" (\"swigluoai\"); "
      "got \"{}\"",
      argument, name);
}

}  // namespace moe::python
