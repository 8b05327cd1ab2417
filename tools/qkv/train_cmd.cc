// qkv train seed001: seed 001's model trained in qkv from Keras' initial weights
// (tests/fixtures/seed001_train), its loss per epoch beside Keras' (issue 15).
#include "commands.h"
#include "qkv/error.h"

namespace qkv::cli {

void register_train(CLI::App& app) {
  CLI::App* train = app.add_subcommand("train", "Train a model in qkv");
  train->require_subcommand(1);
  CLI::App* seed = train->add_subcommand(
      "seed001", "Seed 001 (MultiHeadAttention(2, 4) + Dense(1), Adam, 10 epochs) beside Keras' per-epoch losses");
  seed->callback([] {
    if (!train_seed001_table()) {
      fail<Error>(
          "train seed001: tests/fixtures/seed001_train/history.safetensors not found (run from the repository "
          "root, or set QKV_SEED001_DIR to tests/fixtures/seed001)");
    }
  });
}

}  // namespace qkv::cli
