#define CATCH_CONFIG_MAIN
#include "catch_torch.h"
