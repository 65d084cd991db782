/*
 * types.c -- the sizes and names of the data types and the names of the reduction ops.
 */

#include "base/base.h"

size_t hvdl_type_size(hvdlDataType_t t) {
  static const size_t sizes[HVDL_TYPE_SLOTS] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 2, 2, 1};
  return sizes[hvdl_type_slot(t)];
}

const char *hvdl_type_name(hvdlDataType_t t) {
  static const char *names[HVDL_TYPE_SLOTS] = {
      "int8",    "uint8",   "int32",    "uint32", "int64",  "uint64", "float16",
      "float32", "float64", "bfloat16", "int16",  "uint16", "bool"};
  const int slot = hvdl_type_slot(t);
  return slot >= 0 ? names[slot] : "unknown";
}

const char *hvdl_op_name(hvdlRedOp_t op) {
  static const char *names[hvdlNumOps] = {"sum", "prod", "max", "min", "avg"};
  if (op == hvdlAdasum) return "adasum";
  return (unsigned)op < hvdlNumOps ? names[op] : "unknown";
}
