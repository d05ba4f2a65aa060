// The eager-looking builder API: model code calls ops on Var handles; each call records a Node
// in the Graph. Model code reads like single-device code and never mentions ranks.
//
//   Builder b(&g);
//   auto scope = b.scope("h.0.mlp");          // nodes below get scope "h.0.mlp"
//   b.set_layer(0);
//   Var h = b.gelu(b.linear(x, w_fc, b_fc));  // x @ w_fc^T + b_fc
//   Var y = x + h * 0.5f;
//
// Shape errors in model code are bugs: they abort with the op, scope and input types. User
// input (configs) is validated before a graph is built.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace tessera {

class Builder;

struct Var {
  Builder* b = nullptr;
  ValueId id = -1;
  bool valid() const { return b != nullptr && id >= 0; }
  TensorType type() const;
  // By value: recording a node may reallocate the graph's value table.
  Shape shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  int rank() const { return shape().rank(); }
};

Var operator+(Var a, Var b);
Var operator-(Var a, Var b);
Var operator*(Var a, Var b);
Var operator/(Var a, Var b);
Var operator*(Var a, float s);
Var operator+(Var a, float s);
Var operator-(Var a);

class Builder {
 public:
  explicit Builder(Graph* g) : g_(g) {}
  Graph& graph() { return *g_; }
  Var var(ValueId id) { return Var{this, id}; }

  // Scope management: RAII guard appending "name" to the scope path.
  class ScopeGuard {
   public:
    ScopeGuard(Builder* b, size_t saved) : b_(b), saved_(saved) {}
    ScopeGuard(const ScopeGuard&) = delete;
    ~ScopeGuard() { b_->scope_.resize(saved_); }

   private:
    Builder* b_;
    size_t saved_;
  };
  [[nodiscard]] ScopeGuard scope(const std::string& name);
  void set_layer(int layer) { layer_ = layer; }
  // Parameters declared f32 are created in `dtype` instead (a model built in bf16 or f16:
  // its activations follow their parameters' dtype).
  void set_param_dtype(DType dtype) { param_dtype_ = dtype; }
  void set_backward(bool backward) { backward_ = backward; }
  const std::string& current_scope() const { return scope_; }
  // Records nodes with an explicit scope/layer (used by autodiff to tag gradient nodes).
  void set_position(const std::string& scope, int layer) {
    scope_ = scope;
    layer_ = layer;
  }

  // Sources.
  Var parameter(const std::string& name, Shape shape, Init init, double std = 0.0,
                DType dtype = DType::f32);
  // A parameter whose dim 0 indexes the experts of a mixture-of-experts layer
  // (SourceAttrs::experts).
  Var expert_parameter(const std::string& name, Shape shape, Init init, double std = 0.0);
  Var input(const std::string& name, Shape shape, DType dtype = DType::f32);
  Var fill(Shape shape, double value, DType dtype = DType::f32);

  // Elementwise (binary ops broadcast numpy-style).
  Var add(Var a, Var b);
  Var sub(Var a, Var b);
  Var mul(Var a, Var b);
  Var div(Var a, Var b);
  Var scale(Var x, double s);
  Var add_scalar(Var x, double s);
  Var exp(Var x);
  Var log(Var x);
  Var sqrt(Var x);
  Var rsqrt(Var x);
  Var tanh(Var x);
  Var gelu(Var x);  // tanh approximation
  Var gelu_grad(Var x, Var dy);
  Var silu(Var x);
  Var silu_grad(Var x, Var dy);
  Var relu(Var x);  // max(x, 0)
  Var relu_grad(Var x, Var dy);
  Var swiglu(Var gate, Var up);  // silu(gate) * up
  std::vector<Var> swiglu_grad(Var gate, Var up, Var dy);

  // Reductions and broadcasting.
  Var reduce_sum(Var x, std::vector<int64_t> axes, bool keepdim = false);
  Var sum_to(Var x, const Shape& shape);        // sums broadcast dims away
  Var broadcast_to(Var x, const Shape& shape);  // numpy broadcast

  // Shape ops.
  Var reshape(Var x, const Shape& shape);
  Var transpose(Var x, std::vector<int64_t> perm);
  Var slice(Var x, int axis, int64_t start, int64_t end);
  Var concat(const std::vector<Var>& xs, int axis);
  Var cast(Var x, DType dtype);

  // a [..., M, K] x b [..., K, N] (or b [K, N] shared across a's batch); transposes swap the
  // last two dims.
  Var matmul(Var a, Var b, bool transpose_a = false, bool transpose_b = false);
  // a [..., R, M], b [..., R, N] -> [M, N]: a's rows times b's, summed (MatmulAttrs::fold_batch).
  Var matmul_folded(Var a, Var b);
  // x [..., in] @ w[out, in]^T (+ bias[out]).
  Var linear(Var x, Var w, Var bias = Var{});

  // Neural-network ops.
  Var embedding(Var table, Var ids);                               // table [V,C], ids int32 [...]
  Var embedding_grad(Var dy, Var ids, int64_t vocab);              // -> [V,C]
  std::vector<Var> layernorm(Var x, Var w, Var bias, double eps);  // y, mean, rstd
  std::vector<Var> layernorm_grad(Var dy, Var x, Var w, Var mean, Var rstd);  // dx, dw, db
  std::vector<Var> rmsnorm(Var x, Var w, double eps);                         // y, rstd
  std::vector<Var> rmsnorm_grad(Var dy, Var x, Var w, Var rstd);              // dx, dw
  Var rope(Var x, double theta, bool inverse = false);                        // x [B,T,H,D]
  Var softmax(Var x);                                                         // over the last dim
  Var softmax_grad(Var y, Var dy);
  Var causal_mask(Var scores, double fill);  // [..., T, T]
  // T5's relative position bucket of key j for query i, i32 [Tq, Tk] (ir/position_buckets.h).
  Var position_buckets(int64_t tq, int64_t tk, bool bidirectional, int64_t num_buckets,
                       int64_t max_distance);
  // softmax(scale * q k^T + bias) v on q [B,H,Tq,D], k/v [B,Hkv,Tk,D], causal (Tq == Tk) or
  // bidirectional; bias (optional) f32 [H,Tq,Tk] is added to every example's scores. Returns
  // out [B,H,Tq,D] and lse [B,H,Tq]; the grad returns dq, dk, dv (and dbias with a bias).
  std::vector<Var> attention(Var q, Var k, Var v, double scale, bool causal = true,
                             Var bias = Var{});
  std::vector<Var> attention_grad(Var q, Var k, Var v, Var out, Var lse, Var dout, double scale,
                                  bool causal = true, Var bias = Var{});
  // logits [..., V], targets int32 [...] (the logits' leading dims) -> mean loss [] and lse [...].
  // classes: the logits' first columns that are classes (0: all; padding columns beyond them
  // take no probability).
  std::vector<Var> cross_entropy(Var logits, Var targets, int64_t classes = 0);
  Var cross_entropy_grad(Var logits, Var targets, Var lse, Var dloss, int64_t classes = 0);

  // Generic: records op K with its attributes (OpAttrsOf<K>::type) and returns all its
  // outputs, as in  b.op<OpKind::rope>({x}, {.theta = 5e5})[0].  Aborts on a shape error (a
  // bug in the calling code).
  template <OpKind K>
  std::vector<Var> op(const std::vector<Var>& inputs, typename OpAttrsOf<K>::type attrs = {}) {
    return apply(K, Attrs(std::move(attrs)), inputs);
  }
  // The same for an op known at run time (passes that copy a node).
  std::vector<Var> apply(OpKind op, const Attrs& attrs, const std::vector<Var>& inputs);
  Var apply1(OpKind op, const Attrs& attrs, const std::vector<Var>& inputs) {
    return apply(op, attrs, inputs)[0];
  }

 private:
  Graph* g_;
  std::string scope_;
  int layer_ = -1;
  DType param_dtype_ = DType::f32;
  bool backward_ = false;
};

}  // namespace tessera
