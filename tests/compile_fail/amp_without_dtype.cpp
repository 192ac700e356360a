// expect: NamesDtypeIfEnabled
// A user-written AMP policy that autocasts but does not say to which type: the loop refuses it at its
// type, naming the missing piece, instead of failing deep inside step().
#include <nitro/train/training_loop.hpp>

#include <string_view>

struct MyAmp {
  using family = nitro::family::Amp;
  static constexpr std::string_view name = "mine";
  static constexpr bool enabled = true;
  static constexpr bool scales_loss = false;
  struct Options {};
};

int main() { return sizeof(nitro::TrainingLoop<MyAmp>) > 0; }
