// The sweep tests' common settings.
#pragma once

namespace fp8lab::test {

// A synthetic problem a width-4 ResNet-8 learns in a few steps.
inline const char* kSmall = R"(
[set]
"model.name" = "resnet8"
"model.width" = 4
"data.name" = "synthetic"
"data.image_size" = 8
"data.synthetic_train" = 64
"data.synthetic_test" = 32
"data.synthetic_classes" = 2
"data.synthetic_channels" = 1
"train.epochs" = 2
"train.batch" = 16
"threads" = 1
)";


}  // namespace fp8lab::test
