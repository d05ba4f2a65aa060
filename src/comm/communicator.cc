// The public operations of every Communicator: argument checks (a wrong count, element type,
// root, peer or tag is a bug in the caller, not user input), then the implementation's.
#include "comm/communicator.h"

#include "base/check.h"

namespace tessera {
namespace {

void check_reducible(DType dtype, const std::string& what) {
  TS_CHECK(dtype_is_float(dtype)) << "'" << what << "': cannot reduce " << dtype_name(dtype);
}

}  // namespace

Request Communicator::all_reduce(void* data, int64_t count, DType dtype, std::string what) {
  TS_CHECK_GE(count, 0) << "all_reduce '" << what << "'";
  check_reducible(dtype, what);
  return do_all_reduce(data, count, dtype, std::move(what));
}

Request Communicator::reduce_scatter(const void* in, void* out, int64_t count, DType dtype,
                                     std::string what) {
  TS_CHECK_GE(count, 0) << "reduce_scatter '" << what << "'";
  check_reducible(dtype, what);
  return do_reduce_scatter(in, out, count, dtype, std::move(what));
}

Request Communicator::all_gather(const void* in, void* out, int64_t count, DType dtype,
                                 std::string what) {
  TS_CHECK_GE(count, 0) << "all_gather '" << what << "'";
  return do_all_gather(in, out, count, dtype, std::move(what));
}

Request Communicator::all_to_all(const void* in, void* out, int64_t count, DType dtype,
                                 std::string what) {
  TS_CHECK_GE(count, 0) << "all_to_all '" << what << "'";
  TS_CHECK(count == 0 || in != out) << "all_to_all '" << what << "': in and out overlap";
  return do_all_to_all(in, out, count, dtype, std::move(what));
}

Request Communicator::broadcast(void* data, int64_t count, DType dtype, int root,
                                std::string what) {
  TS_CHECK_GE(count, 0) << "broadcast '" << what << "'";
  TS_CHECK(root >= 0 && root < size())
      << "broadcast '" << what << "': root " << root << " of " << size() << " ranks";
  return do_broadcast(data, count, dtype, root, std::move(what));
}

Request Communicator::send(const void* data, int64_t count, DType dtype, int peer, int tag,
                           std::string what) {
  check_p2p(count, peer, tag, what);
  return do_p2p(false, const_cast<void*>(data), count, dtype, peer, tag, std::move(what));
}

Request Communicator::recv(void* data, int64_t count, DType dtype, int peer, int tag,
                           std::string what) {
  check_p2p(count, peer, tag, what);
  return do_p2p(true, data, count, dtype, peer, tag, std::move(what));
}

void Communicator::check_p2p(int64_t count, int peer, int tag, const std::string& what) const {
  TS_CHECK_GE(count, 0) << what;
  TS_CHECK(peer >= 0 && peer < size() && peer != rank())
      << what << ": peer " << peer << " of " << size() << " ranks (this is " << rank() << ")";
  TS_CHECK(tag >= 0 && tag <= kMaxP2PTag) << what << ": tag " << tag;
}

}  // namespace tessera
