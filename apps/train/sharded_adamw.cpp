#include "apps/train/sharded_adamw.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <unordered_map>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "apps/train/gradient_ready.h"
#include "kernels/ops/adamw.h"

namespace tt {
namespace {

// The slice length of a tensor of `numel` elements over `world` ranks.
int64_t slice_length(int64_t numel, int world) {
  const int64_t even = (numel + world - 1) / world;
  return (even + ShardedAdamW::kSliceAlign - 1) / ShardedAdamW::kSliceAlign * ShardedAdamW::kSliceAlign;
}

// One flat tensor cut into slices: a parameter's master, its compute copy, or a gradient leaf.
struct Sliced {
  torch::Tensor flat;  // the tensor's storage as one dimension (detached: the collectives write into it)
  int64_t numel = 0, slice = 0;
  int64_t begin = 0, end = 0;  // this rank's elements [begin, end), possibly empty
  bool padded(int world) const { return numel != slice * world; }
  torch::Tensor mine() const { return flat.narrow(0, begin, end - begin); }
};

}  // namespace

struct ShardedAdamW::Impl {
  DistributedContext& context;
  int rank, world;
  OptimizerKind kind;  // whose update runs on the slices: ours or at::_fused_adamw_
  AdamWOptions options;
  ops::AdamWHyperparameters hyper;
  torch::Tensor state;  // ours: adamw_state, the step counter and the step's scalars, the same on every rank
  // at::_fused_adamw_: its step counters (one per entry of `update`, as FusedAdamW keeps one per parameter) and
  // the host's count, which gives the learning rate (these stages run eagerly).
  std::vector<torch::Tensor> steps;
  int64_t host_steps = 0;

  // The gradient leaves, then the gathered casts (entries to gather only: tensor is the cast, grad_slice undefined).
  struct Leaf {
    torch::Tensor tensor;  // the leaf itself, whose .grad() the backward fills
    Sliced sliced;
    torch::Tensor grad_slice;  // [slice], the leaf's dtype: this rank's slice of the averaged gradient
  };
  std::vector<Leaf> leaves;
  std::unordered_map<const void*, size_t> leaf_of;  // TensorImpl -> index in leaves

  struct Param {
    Sliced master, copy;  // copy.flat undefined without a compute copy
    // The projection's gathered cast (bf16 autocast runs without compute copies): what is all-gathered instead of
    // the master, whose other ranks' slices then go stale (gather_weights() makes it whole). Undefined otherwise.
    Sliced cast;
    int cast_entry = -1;  // its entry in `leaves` (no gradient leaf: only gathered)
    int master_leaf = -1, copy_leaf = -1;
    torch::Tensor exp_avg, exp_avg_sq;  // [end - begin]
    std::vector<int64_t> shape;
  };
  std::vector<Param> params;
  std::vector<torch::Tensor> copies;  // the model's compute copies (their gradients reset by zero_grad)

  // The update: this rank's non-empty slices as adamw's list, and per layer range the part of that list and the
  // leaves to all-gather after it.
  std::vector<ops::AdamWParam> update;
  struct Range {
    size_t begin = 0, end = 0;   // in `update`
    std::vector<size_t> gather;  // indices in `leaves`
    std::vector<size_t> casts;   // indices in `params` whose gathered cast the update refreshes
    int64_t layer = -1;          // layers.<layer>; -1 outside the layers
  };
  std::vector<Range> ranges;
  // What one all-gather call brings, and the forward's part that waits for it (TransformerImpl::set_before_weights:
  // -1 before the embedding, i before layer i, n before the final norm and the head). kUpdate: one group per range,
  // queued after its update. kForward: the first two queued after their updates, the others together by the
  // forward, in the order it waits for them.
  struct Pending {
    torch::Tensor into, from;
  };
  struct Group {
    std::vector<size_t> leaves;  // indices in `leaves`
    int64_t part = -1;
    // kForward: queued by step() right after the update of ranges[after] (the forward's first parts: nothing
    // could run beside their gathers in the forward, while the later layers' updates can), not by the forward.
    bool with_update = false;
    size_t after = 0;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;  // queued, not yet waited for
    std::vector<Pending> pending;
  };
  std::vector<Group> groups;
  bool gather_in_forward;  // ZeroGather::kForward
  // kForward: outside this rank's slices, the groups the forward gathers hold other ranks' values of before the
  // last update (the step's own gathers, with_update, are current).
  bool stale = false;
  Transformer model;  // whose forward calls before_weights()
  // Disables the model's gathered casts when this optimizer goes, if it enabled them (also when its constructor
  // throws after enabling them: a member already built is destroyed then).
  struct CastsOwner {
    Transformer model{nullptr};
    ~CastsOwner() {
      if (model) model->disable_gathered_casts();
    }
  } casts_owner;
  std::vector<size_t> stale_masters;  // parameters whose master is no leaf: gathered by gather_weights() only
  torch::Tensor partials, norm;       // with clipping: the norm pass's partial sums; their sum over ranks

  Impl(DistributedContext& context, const Transformer& model, OptimizerKind kind, const AdamWOptions& o,
       ZeroGather gather)
      : context(context),
        rank(context.rank()),
        world(context.world_size()),
        kind(kind),
        options(o),
        hyper{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.max_grad_norm, o.schedule},
        gather_in_forward(gather == ZeroGather::kForward),
        model(model) {
    TORCH_CHECK(kind == OptimizerKind::kOurAdamW || kind == OptimizerKind::kAtenFusedAdamW,
                "the sharded optimizer (ZeRO-1) updates slices with a multi-tensor AdamW (",
                implementation(OptimizerKind::kOurAdamW).name, " or ",
                implementation(OptimizerKind::kAtenFusedAdamW).name, "); the stage chose ", implementation(kind).name);
    TORCH_CHECK(!o.overlap, "the sharded optimizer (ZeRO-1) updates after the backward: the overlap is not allowed");
    TORCH_CHECK(
        kind == OptimizerKind::kOurAdamW || (model->compute_copies().empty() && o.state_dtype == torch::kFloat32),
        "the sharded optimizer: compute copies and bf16 moments need ", implementation(OptimizerKind::kOurAdamW).name,
        "; the stage chose ", implementation(kind).name);
    const auto found = gradient_leaves(this->model);
    std::vector<std::string> names;
    std::vector<torch::Tensor> parameters;
    for (const auto& named : model->named_parameters(/*recurse=*/true)) {
      names.push_back(named.key());
      parameters.push_back(named.value());
    }
    TORCH_CHECK(!parameters.empty(), "the sharded optimizer needs parameters");
    state = ops::adamw_state(parameters.front().device());
    for (const auto& c : model->compute_copies()) copies.push_back(c.copy);
    // bf16 autocast without compute copies (v2, v3): the forward reads the projections' weights as bf16 casts, so
    // the casts are gathered, not the fp32 masters: half the bytes, the same values in the forward.
    if (model->precision() == Precision::kBf16 && model->compute_copies().empty()) {
      this->model->enable_gathered_casts(torch::kBFloat16);
      casts_owner.model = this->model;
    }
    for (const auto& leaf : found) {
      leaf_of[leaf.unsafeGetTensorImpl()] = leaves.size();
      Leaf l{leaf, sliced(leaf), torch::Tensor()};
      l.grad_slice = torch::zeros({l.sliced.slice}, leaf.options().requires_grad(false));
      leaves.push_back(std::move(l));
    }
    auto leaf_index = [&](const torch::Tensor& t) {
      auto it = leaf_of.find(t.unsafeGetTensorImpl());
      return it == leaf_of.end() ? -1 : static_cast<int>(it->second);
    };
    for (const auto& p : parameters) {
      Param param;
      param.shape = p.sizes().vec();
      param.master = sliced(p);
      param.master_leaf = leaf_index(p);
      for (const auto& c : model->compute_copies())
        if (c.master.is_same(p)) {
          param.copy = sliced(c.copy);
          param.copy_leaf = leaf_index(c.copy);
        }
      TORCH_CHECK(param.master_leaf >= 0 || param.copy_leaf >= 0, "the sharded optimizer: parameter '",
                  names[params.size()], "' receives no gradient; every parameter must receive one");
      const auto moments = p.options().dtype(o.state_dtype).requires_grad(false);
      param.exp_avg = torch::zeros({param.master.end - param.master.begin}, moments);
      param.exp_avg_sq = torch::zeros({param.master.end - param.master.begin}, moments);
      if (auto* projection = model->projection_of(p); projection && projection->gathered_cast.defined()) {
        param.cast = sliced(projection->gathered_cast);
        param.cast_entry = static_cast<int>(leaves.size());
        leaves.push_back({projection->gathered_cast, param.cast, torch::Tensor()});
      }
      if (param.master_leaf < 0 || param.cast_entry >= 0) stale_masters.push_back(params.size());
      params.push_back(std::move(param));
    }
    for (const auto& range : layer_ranges(names)) {
      Range r;
      const std::string& first = names[range.begin];  // layers.<i>.... inside a layer
      if (first.rfind("layers.", 0) == 0) r.layer = std::stoll(first.substr(7, first.find('.', 7) - 7));
      r.begin = update.size();
      for (size_t i = range.begin; i < range.end; ++i) {
        Param& p = params[i];
        if (p.cast_entry >= 0) {
          r.gather.push_back(static_cast<size_t>(p.cast_entry));  // the cast, not the master
          r.casts.push_back(i);
        } else {
          for (const int leaf : {p.master_leaf, p.copy_leaf})
            if (leaf >= 0) r.gather.push_back(static_cast<size_t>(leaf));
        }
        if (p.master.end == p.master.begin) continue;
        update.push_back(adamw_param(p));
      }
      r.end = update.size();
      ranges.push_back(std::move(r));
    }
    gather_groups(gather);
    partials = update.empty() || !ours() ? torch::zeros({1}, state.options()) : ops::adamw_partials(update, state);
    norm = torch::zeros({1}, state.options());
    if (!ours())
      for (size_t i = 0; i < update.size(); ++i) steps.push_back(torch::zeros({}, state.options()));
  }

  bool ours() const { return kind == OptimizerKind::kOurAdamW; }
  bool clipping() const { return hyper.max_grad_norm > 0; }

  // The squared global gradient norm into `norm`: this rank's slices' sum of squares, summed over ranks.
  void global_norm() {
    if (update.empty()) {
      norm.zero_();
    } else if (ours()) {
      ops::adamw_norm(update, 0, update.size(), partials);
      norm.copy_(partials.sum().view({1}));
    } else {
      std::vector<torch::Tensor> grads;
      for (const auto& u : update) grads.push_back(u.grad);
      norm.copy_(torch::stack(at::_foreach_norm(grads, 2)).to(torch::kFloat32).square().sum().view({1}));
    }
    std::vector<torch::Tensor> sum_of{norm};
    c10d::AllreduceOptions sum;
    sum.reduceOp = c10d::ReduceOp::SUM;
    context.group()->allreduce(sum_of, sum)->wait();
  }

  // at::_fused_adamw_ on entries [begin, end) of `update`, as FusedAdamW steps (apps/train/optimizer.cpp) on whole
  // parameters: every element's arithmetic is the same. Their step counters were advanced for this step.
  void aten_update(size_t begin, size_t end) {
    std::vector<torch::Tensor> masters, grads, m, v, counts;
    for (size_t i = begin; i < end; ++i) {
      masters.push_back(update[i].master);
      grads.push_back(update[i].grad);
      m.push_back(update[i].exp_avg);
      v.push_back(update[i].exp_avg_sq);
      counts.push_back(steps[i]);
    }
    at::_fused_adamw_(masters, grads, m, v, {}, counts, options.lr_at_step(host_steps), options.beta1, options.beta2,
                      options.weight_decay, options.eps, /*amsgrad=*/false, /*maximize=*/false, std::nullopt,
                      std::nullopt);
  }

  Sliced sliced(const torch::Tensor& t) const {
    TORCH_CHECK(t.is_contiguous(), "the sharded optimizer needs contiguous parameters");
    Sliced s;
    s.flat = t.detach().view({-1});
    s.numel = t.numel();
    s.slice = slice_length(s.numel, world);
    s.begin = std::min(s.numel, rank * s.slice);
    s.end = std::min(s.numel, (rank + 1) * s.slice);
    return s;
  }

  // Parameter p's slice as adamw's list entry: the gradients are the reduce-scattered slices.
  ops::AdamWParam adamw_param(const Param& p) const {
    const int64_t n = p.master.end - p.master.begin;
    auto grad_of = [&](int leaf) { return leaf < 0 ? torch::Tensor() : leaves[leaf].grad_slice.narrow(0, 0, n); };
    return {p.master.mine(), grad_of(p.master_leaf), p.copy.flat.defined() ? p.copy.mine() : torch::Tensor(),
            grad_of(p.copy_leaf), p.exp_avg, p.exp_avg_sq};
  }

  // Queues the all-gather of `slices` (this rank's part of each) into place, one call per dtype; finish() makes the
  // current stream wait for them. A tensor whose length is no multiple of the world's slices goes through a padded
  // buffer, copied into place by finish().
  std::vector<c10::intrusive_ptr<c10d::Work>> all_gather(const std::vector<const Sliced*>& slices,
                                                         std::vector<Pending>& pending) {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<torch::Dtype> dtypes;  // one call per dtype, in the order they first appear
    for (const Sliced* s : slices)
      if (std::find(dtypes.begin(), dtypes.end(), s->flat.scalar_type()) == dtypes.end())
        dtypes.push_back(s->flat.scalar_type());
    for (const auto dtype : dtypes) {
      std::vector<torch::Tensor> outputs, inputs;
      for (const Sliced* s : slices) {
        if (s->flat.scalar_type() != dtype) continue;
        if (!s->padded(world)) {
          outputs.push_back(s->flat);
          inputs.push_back(s->flat.narrow(0, rank * s->slice, s->slice));  // in place
          continue;
        }
        auto input = torch::zeros({s->slice}, s->flat.options());
        input.narrow(0, 0, s->end - s->begin).copy_(s->mine());
        auto output = torch::empty({s->slice * world}, s->flat.options());
        inputs.push_back(input);
        outputs.push_back(output);
        pending.push_back({s->flat, output.narrow(0, 0, s->numel)});
      }
      works.push_back(context.group()->allgather_into_tensor_coalesced(outputs, inputs));
    }
    return works;
  }

  static void finish(std::vector<c10::intrusive_ptr<c10d::Work>>& works, std::vector<Pending>& pending) {
    for (auto& work : works) work->wait();  // a stream wait on the GPU
    for (auto& p : pending) p.into.copy_(p.from);
    works.clear();
    pending.clear();
  }

  // The groups (above). With kForward a layer's leaves are waited for before that layer, the embedding's before
  // the embedding, and those after the layers (the final norm's) and what only the output head reads (an untied
  // head, which comes before the layers in named_parameters(), or a tied head's compute copy) before the final
  // norm, queued last. The embedding's
  // and layer 0's groups are gathered by step() after their updates, beside the later layers' updates, so the
  // next forward starts at once; each later layer's gather runs beside the layers before it.
  void gather_groups(ZeroGather gather) {
    const int64_t n_layers = static_cast<int64_t>(model->layers->size());
    if (gather == ZeroGather::kUpdate) {
      for (size_t i = 0; i < ranges.size(); ++i) {
        Group g;
        g.leaves = ranges[i].gather;
        g.part = ranges[i].layer;
        g.after = i;
        groups.push_back(std::move(g));
      }
      return;
    }
    const torch::Tensor& lookup = model->embed_tokens->weight;
    torch::Tensor head = model->config().tie_embeddings ? lookup : model->lm_head_weight;
    for (const auto& c : model->compute_copies())
      if (c.master.is_same(head)) head = c.copy;
    Group last;
    last.part = n_layers;
    last.after = ranges.size() - 1;
    bool after_layers = false;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const Range& r = ranges[i];
      if (r.layer >= 0) after_layers = true;
      Group g;
      g.part = r.layer >= 0 ? r.layer : (after_layers ? n_layers : -1);
      g.after = i;
      g.with_update = g.part <= 0;
      for (const size_t leaf : r.gather)
        (g.part == n_layers || (leaves[leaf].tensor.is_same(head) && !head.is_same(lookup)) ? last : g)
            .leaves.push_back(leaf);
      if (!g.leaves.empty()) groups.push_back(std::move(g));
    }
    if (!last.leaves.empty()) groups.push_back(std::move(last));
    std::stable_sort(groups.begin(), groups.end(), [](const Group& a, const Group& b) { return a.part < b.part; });
  }

  // Queues group g's all-gather (this rank's slices of what the forward reads).
  void queue_gather(size_t g) {
    std::vector<const Sliced*> slices;
    for (const size_t leaf : groups[g].leaves) slices.push_back(&leaves[leaf].sliced);
    for (auto& work : all_gather(slices, groups[g].pending)) groups[g].works.push_back(std::move(work));
  }
  void wait_for(int64_t part) {
    for (auto& g : groups)
      if (g.part == part) finish(g.works, g.pending);
  }
  void wait_all() {
    for (auto& g : groups) finish(g.works, g.pending);
  }
  // The all-gathers the last update left to the forward, in the forward's order, when they are stale.
  void start_gathers() {
    if (!stale) return;
    for (size_t g = 0; g < groups.size(); ++g)
      if (!groups[g].with_update) queue_gather(g);
    stale = false;
  }
  // The forward, before it reads a part's weights: the first part queues the all-gathers the step left to it (on
  // NCCL's stream, beside the forward), and each part waits for its own only.
  void before_weights(int64_t part) {
    torch::NoGradGuard no_grad;
    if (part < 0) start_gathers();
    wait_for(part);
  }

  // A moment of parameter i, whole (each rank's slice gathered).
  torch::Tensor gather_moment(size_t i, const torch::Tensor& mine) const {
    torch::NoGradGuard no_grad;
    const Param& p = params[i];
    auto input = torch::zeros({p.master.slice}, mine.options());
    input.narrow(0, 0, mine.numel()).copy_(mine);
    auto output = torch::empty({p.master.slice * world}, mine.options());
    std::vector<torch::Tensor> outputs{output}, inputs{input};
    context.group()->allgather_into_tensor_coalesced(outputs, inputs)->wait();
    return output.narrow(0, 0, p.master.numel).view(p.shape);
  }
};

ShardedAdamW::ShardedAdamW(DistributedContext& context, const Transformer& model, OptimizerKind kind,
                           const AdamWOptions& options, ZeroGather gather)
    : Optimizer(model->parameters()), impl_(std::make_unique<Impl>(context, model, kind, options, gather)) {
  if (impl_->gather_in_forward)
    impl_->model->set_before_weights([impl = impl_.get()](int64_t layer) { impl->before_weights(layer); });
}

ShardedAdamW::~ShardedAdamW() {
  if (impl_->gather_in_forward) impl_->model->set_before_weights({});
}

ZeroGather ShardedAdamW::gather() const {
  return impl_->gather_in_forward ? ZeroGather::kForward : ZeroGather::kUpdate;
}

void ShardedAdamW::begin_step() {
  if (impl_->gather_in_forward) impl_->stale = true;
}

c10::intrusive_ptr<c10d::Work> ShardedAdamW::reduce_scatter(const std::vector<torch::Tensor>& leaves) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> inputs, outputs;
  for (const auto& leaf : leaves) {
    auto it = impl_->leaf_of.find(leaf.unsafeGetTensorImpl());
    TORCH_CHECK(it != impl_->leaf_of.end(), "ShardedAdamW::reduce_scatter: a tensor that is no gradient leaf of the model");
    const Impl::Leaf& l = impl_->leaves[it->second];
    TORCH_CHECK(l.tensor.grad().defined(), "ShardedAdamW::reduce_scatter: a gradient leaf of shape ", l.tensor.sizes(),
                " has no gradient; every one must receive one each step");
    auto grad = l.tensor.grad().detach().reshape({-1});
    if (l.sliced.padded(impl_->world)) {
      auto padded = torch::zeros({l.sliced.slice * impl_->world}, grad.options());
      padded.narrow(0, 0, l.sliced.numel).copy_(grad);
      grad = padded;
    }
    inputs.push_back(grad);
    outputs.push_back(l.grad_slice);
  }
  c10d::ReduceScatterOptions options;
  options.reduceOp = c10d::ReduceOp::AVG;
  return impl_->context.group()->reduce_scatter_tensor_coalesced(outputs, inputs, options);
}

void ShardedAdamW::take_averaged(const torch::Tensor& leaf) {
  torch::NoGradGuard no_grad;
  auto it = impl_->leaf_of.find(leaf.unsafeGetTensorImpl());
  TORCH_CHECK(it != impl_->leaf_of.end(), "ShardedAdamW::take_averaged: a tensor that is no gradient leaf of the model");
  const Impl::Leaf& l = impl_->leaves[it->second];
  TORCH_CHECK(l.tensor.grad().defined(), "ShardedAdamW::take_averaged: a gradient leaf of shape ", l.tensor.sizes(),
              " has no gradient; every one must receive one each step");
  const int64_t n = l.sliced.end - l.sliced.begin;
  if (n < l.sliced.slice) l.grad_slice.zero_();  // the last slice's padding, as reduce_scatter() leaves it
  if (n > 0) l.grad_slice.narrow(0, 0, n).copy_(l.tensor.grad().detach().reshape({-1}).narrow(0, l.sliced.begin, n));
}

void ShardedAdamW::zero_grad() {
  for (auto& p : params_) p.mutable_grad() = torch::Tensor();
  for (auto& c : impl_->copies) c.mutable_grad() = torch::Tensor();
}

void ShardedAdamW::step() {
  torch::NoGradGuard no_grad;
  Impl& s = *impl_;
  s.wait_all();  // no all-gather may still read the slices the update writes (the forward waited for each)
  if (s.clipping()) s.global_norm();
  if (s.ours()) {
    ops::adamw_prepare(s.norm, s.state, s.hyper);
  } else {
    if (s.clipping() && !s.update.empty()) {  // clip_grad_norm's factor, from the global norm, on the slices
      std::vector<torch::Tensor> grads;
      for (const auto& u : s.update) grads.push_back(u.grad);
      at::_foreach_mul_(grads, clip_factor(s.norm.sqrt().squeeze(), s.hyper.max_grad_norm));
    }
    if (!s.steps.empty()) at::_foreach_add_(s.steps, 1.0);
    ++s.host_steps;
  }
  // Layer by layer: update this rank's slices; after each layer's update, all-gather them while the next layer
  // updates (ZeroGather::kUpdate), or leave that to the next forward (kForward: before_weights).
  for (size_t r = 0; r < s.ranges.size(); ++r) {
    const auto& range = s.ranges[r];
    if (range.begin < range.end) {
      if (s.ours()) {
        ops::adamw_update(s.update, range.begin, range.end, s.state, s.hyper);
      } else {
        s.aten_update(range.begin, range.end);
      }
    }
    for (const size_t i : range.casts) s.params[i].cast.mine().copy_(s.params[i].master.mine());  // RNE, as autocast
    for (size_t g = 0; g < s.groups.size(); ++g)
      if ((!s.gather_in_forward || s.groups[g].with_update) && s.groups[g].after == r) s.queue_gather(g);
  }
  s.wait_all();
  if (s.gather_in_forward) s.stale = true;
}

void ShardedAdamW::gather_weights() {
  torch::NoGradGuard no_grad;
  impl_->start_gathers();  // what the forward reads, when the last update left it to the next forward
  std::vector<const Sliced*> slices;
  for (const size_t i : impl_->stale_masters) slices.push_back(&impl_->params[i].master);
  std::vector<Impl::Pending> pending;
  auto works = impl_->all_gather(slices, pending);
  Impl::finish(works, pending);
  impl_->wait_all();
}

torch::Tensor ShardedAdamW::exp_avg(size_t i) const { return impl_->gather_moment(i, impl_->params.at(i).exp_avg); }
torch::Tensor ShardedAdamW::exp_avg_sq(size_t i) const {
  return impl_->gather_moment(i, impl_->params.at(i).exp_avg_sq);
}

int64_t ShardedAdamW::step_count() const {
  if (!impl_->ours()) return impl_->host_steps;
  return static_cast<int64_t>(impl_->state[ops::kAdamWStep].item<float>());
}

void ShardedAdamW::load_state(const std::vector<torch::Tensor>& m, const std::vector<torch::Tensor>& v,
                              int64_t step) {
  torch::NoGradGuard no_grad;
  TORCH_CHECK(m.size() == impl_->params.size() && v.size() == impl_->params.size(),
              "ShardedAdamW::load_state: moments for ", m.size(), " parameters, the model has ", impl_->params.size());
  for (size_t i = 0; i < impl_->params.size(); ++i) {
    auto& p = impl_->params[i];
    const int64_t n = p.master.end - p.master.begin;
    p.exp_avg.copy_(m[i].reshape({-1}).narrow(0, p.master.begin, n));
    p.exp_avg_sq.copy_(v[i].reshape({-1}).narrow(0, p.master.begin, n));
  }
  impl_->state[ops::kAdamWStep].fill_(static_cast<double>(step));
  for (auto& count : impl_->steps) count.fill_(static_cast<double>(step));
  impl_->host_steps = step;
}

int64_t ShardedAdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : impl_->params)
    bytes += (p.exp_avg.numel() + p.exp_avg_sq.numel()) * static_cast<int64_t>(p.exp_avg.element_size());
  return bytes;
}

std::optional<std::string> hardware_queues() {
  const char* set = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  return set && *set ? std::optional<std::string>(set) : std::nullopt;  // empty: unset, as CUDA takes it
}

OptimizerMaker sharded_adamw(DistributedContext& context, OptimizerKind kind, ZeroGather gather) {
  return [&context, kind, gather](const Transformer& model, const AdamWOptions& options) -> std::unique_ptr<Optimizer> {
    return std::make_unique<ShardedAdamW>(context, model, kind, options, gather);
  };
}

}  // namespace tt
