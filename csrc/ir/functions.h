// Module-level functions that graphs call by name ("func.call"): user kernels given as
// StableHLO text (torch_pjrt.library). Process-wide; a name is bound to one text for
// the life of the process, so a graph's key (which holds the callee's name) names its code.
#pragma once

#include <string>
#include <vector>

namespace torch_pjrt::ir {

// Binds `name` to `text`: one or more func.func definitions, the entry one named `name`.
// Binding a name again to the same text is a no-op; to another text, an error.
void define_function(const std::string& name, const std::string& text);
bool function_defined(const std::string& name);
// The definitions of these callees, each once, in the order given.
std::string function_definitions(const std::vector<std::string>& callees);

}  // namespace torch_pjrt::ir
