#pragma once
// The syntax tree of a chat template: expressions and statements, each with its line and column.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dstrain/text/jinja/value.h"

namespace dstrain::text::jinja {

struct Where {
  int line = 1, column = 1;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;
struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind { kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kUnary, kBinary, kCond, kList, kTuple, kDict };
  Kind kind;
  Where where;
  Value literal;                  // kLiteral
  std::string name;               // kName, kAttr (the attribute), kFilter/kTest (the filter or test), kUnary/kBinary (the operator)
  std::vector<ExprPtr> operands;  // the object/operands first, then positional arguments or elements (kDict: key, value, ...)
  std::vector<std::pair<std::string, ExprPtr>> keywords;  // kCall, kFilter, kTest
  bool negated = false;                                   // kTest: `is not`
  bool has_else = true;                                   // kCond: `a if c` without else
  size_t first_argument = 1;                              // kCall/kFilter/kTest: where the arguments start in operands
  Expr(Kind k, Where w) : kind(k), where(w) {}
};

struct Stmt {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kGeneration, kFilterBlock, kCallBlock };
  Kind kind;
  Where where;
  std::string text;                  // kText; kSet/kSetBlock/kMacro: the name; kFilterBlock: the filter
  std::string attribute;             // kSet on a namespace: `set ns.attribute = ...`
  std::vector<std::string> targets;  // kFor (loop variables), kSet (names of a tuple assignment), kMacro (parameters)
  std::vector<ExprPtr>
      exprs;  // kOutput: [value]; kIf: conditions; kFor: [iterable, filter?]; kSet: [value]; kMacro: defaults (nullptr: none)
  std::vector<Body> bodies;  // kIf: one per condition, then else; kFor: [body, else]; others: [body]
  bool has_filter = false;   // kFor: `for x in xs if cond`
  bool recursive = false;    // kFor: `recursive`
  ExprPtr call;              // kCallBlock: the macro call
  Stmt(Kind k, Where w) : kind(k), where(w) {}
};

}  // namespace dstrain::text::jinja
